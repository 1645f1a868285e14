//! Dev-only test harness shared by the end-to-end tests: one way to run a real `spillway serve`
//! process, and the deterministic test data they write.
//!
//! Every end-to-end test needs the same dance: spawn the binary with the flags of its scenario,
//! wait for the `listening <endpoint>…` line (bounded, with the server's stderr in the error when
//! it never comes), kill or SIGTERM it, restart it on the same directories and port, grep its log,
//! and never leak a process when an assertion fails. [`ServerProcess`] does that once; the binary
//! is a parameter (cli tests pass `env!("CARGO_BIN_EXE_spillway")`, other crates find it their
//! own way). [`pattern`] and [`same_bytes`] are the shared data generator and comparison.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use spillway_proto::Endpoint;

/// How long a server may take to print its `listening` line by default. Generous: two cores are
/// shared by several test binaries, and a restart replays the store's journal.
pub const READY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// Why a server process could not be started, stopped or restarted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("server {name}: cannot start {binary}: {source}")]
    Spawn { name: String, binary: PathBuf, source: std::io::Error },
    #[error("server {name}: cannot open log {log}: {source}")]
    Log { name: String, log: PathBuf, source: std::io::Error },
    #[error("server {name} did not start: {line:?}; log ({log}): {stderr}")]
    NotListening { name: String, line: String, log: PathBuf, stderr: String },
    #[error("server {name} printed no listening line within {timeout:?}; log ({log}): {stderr}")]
    ReadyTimeout { name: String, timeout: Duration, log: PathBuf, stderr: String },
    #[error(
        "server {name} printed an unparsable endpoint {text:?} ({problem}); log ({log}): {stderr}"
    )]
    BadEndpoint { name: String, text: String, problem: String, log: PathBuf, stderr: String },
    #[error("server {name} ignored SIGTERM for {timeout:?}; log ({log}): {stderr}")]
    TermTimeout { name: String, timeout: Duration, log: PathBuf, stderr: String },
    #[error("server {name} (pid {pid}) is still running; stop it before restarting")]
    StillRunning { name: String, pid: u32 },
    #[error("server {name}: waiting for pid {pid}: {source}")]
    Wait { name: String, pid: u32, source: std::io::Error },
}

/// The flags and environment of one `spillway serve` process; kept by [`ServerProcess`] so that
/// [`ServerProcess::restart`] runs the same server again.
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    binary: PathBuf,
    name: String,
    listen: String,
    unix_socket: Option<PathBuf>,
    ssd_dir: PathBuf,
    dram_bytes: String,
    pfs_dir: Option<PathBuf>,
    drain: Option<(String, usize)>,
    durability: Option<String>,
    extra_args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: PathBuf,
    ready_timeout: Duration,
}

impl ServerBuilder {
    /// Server `name` run from `binary`: TCP on an ephemeral loopback port, 32 MiB of DRAM, SSD
    /// directory `<dir>/<name>-ssd`, stderr appended to `<dir>/<name>.log`.
    pub fn new(binary: impl Into<PathBuf>, dir: &Path, name: &str) -> ServerBuilder {
        ServerBuilder {
            binary: binary.into(),
            name: name.to_string(),
            listen: "127.0.0.1:0".to_string(),
            unix_socket: None,
            ssd_dir: dir.join(format!("{name}-ssd")),
            dram_bytes: "32M".to_string(),
            pfs_dir: None,
            drain: None,
            durability: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            log: dir.join(format!("{name}.log")),
            ready_timeout: READY_TIMEOUT_DEFAULT,
        }
    }

    /// TCP listen address (`127.0.0.1:0` by default).
    pub fn listen(mut self, address: &str) -> Self {
        self.listen = address.to_string();
        self
    }

    /// No TCP listener (`--listen ""`): only the Unix socket, if any.
    pub fn no_tcp(self) -> Self {
        self.listen("")
    }

    /// Also listen on this Unix socket; a stale socket file is removed before each spawn.
    pub fn unix_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.unix_socket = Some(path.into());
        self
    }

    pub fn ssd_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssd_dir = path.into();
        self
    }

    /// `--dram-bytes`, with the CLI's suffixes (`32M`).
    pub fn dram_bytes(mut self, bytes: &str) -> Self {
        self.dram_bytes = bytes.to_string();
        self
    }

    pub fn pfs_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.pfs_dir = Some(path.into());
        self
    }

    /// `--drain-peers` (the whole reservation, in order) and `--drain-self-index`.
    pub fn drain_peers(mut self, peers: &[Endpoint], self_index: usize) -> Self {
        let list = peers.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
        self.drain = Some((list, self_index));
        self
    }

    /// `--durability` (`memory`, `ssd`, …).
    pub fn durability(mut self, durability: &str) -> Self {
        self.durability = Some(durability.to_string());
        self
    }

    /// Any other flag, passed after the ones above.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Several other flags, passed after the ones above.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for the server, e.g. a knob `SPILLWAY_STORE_SEGMENT_BYTES_MAX`.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// `RUST_LOG` for the server (inherited from the test when not set).
    pub fn rust_log(self, filter: &str) -> Self {
        self.env("RUST_LOG", filter)
    }

    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = path.into();
        self
    }

    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Spawns the server and waits for its `listening` line.
    pub fn spawn(self) -> Result<ServerProcess, ServerError> {
        let (child, endpoints) = self.launch()?;
        Ok(ServerProcess { child, endpoints, config: self })
    }

    /// [`spawn`](Self::spawn), panicking with the error (which carries the server's stderr).
    #[track_caller]
    pub fn start(self) -> ServerProcess {
        self.spawn().unwrap_or_else(|error| panic!("{error}"))
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn launch(&self) -> Result<(Child, Vec<Endpoint>), ServerError> {
        let name = &self.name;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).map_err(
            |source| ServerError::Log { name: name.clone(), log: self.log.clone(), source },
        )?;
        let mut command = Command::new(&self.binary);
        command.args([
            "serve",
            "--listen",
            &self.listen,
            "--dram-bytes",
            &self.dram_bytes,
            "--name",
            name,
        ]);
        if let Some(socket) = &self.unix_socket {
            let _ = std::fs::remove_file(socket);
            command.arg("--unix-socket").arg(socket);
        }
        command.arg("--ssd-dir").arg(&self.ssd_dir);
        if let Some(pfs) = &self.pfs_dir {
            command.arg("--pfs-dir").arg(pfs);
        }
        if let Some((peers, index)) = &self.drain {
            command.args(["--drain-peers", peers, "--drain-self-index", &index.to_string()]);
        }
        if let Some(durability) = &self.durability {
            command.args(["--durability", durability]);
        }
        command.args(&self.extra_args).envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = command.stdout(Stdio::piped()).stderr(log).spawn().map_err(|source| {
            ServerError::Spawn { name: name.clone(), binary: self.binary.clone(), source }
        })?;
        // The first stdout line, read on a thread so that a hung server cannot hang the test.
        let stdout = child.stdout.take().expect("stdout was piped");
        let (sender, receiver) = mpsc::sync_channel(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let line = match receiver.recv_timeout(self.ready_timeout) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ServerError::ReadyTimeout {
                    name: name.clone(),
                    timeout: self.ready_timeout,
                    log: self.log.clone(),
                    stderr: self.stderr_text(),
                });
            }
        };
        let parsed = match line.strip_prefix("listening ") {
            None => Err(ServerError::NotListening {
                name: name.clone(),
                line: line.clone(),
                log: self.log.clone(),
                stderr: self.stderr_text(),
            }),
            Some(rest) => rest
                .split_whitespace()
                .map(|text| {
                    text.parse::<Endpoint>().map_err(|problem| ServerError::BadEndpoint {
                        name: name.clone(),
                        text: text.to_string(),
                        problem,
                        log: self.log.clone(),
                        stderr: self.stderr_text(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(|endpoints| {
                    if endpoints.is_empty() {
                        Err(ServerError::NotListening {
                            name: name.clone(),
                            line: line.clone(),
                            log: self.log.clone(),
                            stderr: self.stderr_text(),
                        })
                    } else {
                        Ok(endpoints)
                    }
                }),
        };
        match parsed {
            Ok(endpoints) => Ok((child, endpoints)),
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(error)
            }
        }
    }
}

/// A running (or stopped, awaiting [`restart`](Self::restart)) `spillway serve` child; killed and
/// reaped when dropped, so a failing test leaves no server behind.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    endpoints: Vec<Endpoint>,
    config: ServerBuilder,
}

impl ServerProcess {
    /// A builder for server `name` of `binary`, with its files under `dir`.
    pub fn builder(binary: impl Into<PathBuf>, dir: &Path, name: &str) -> ServerBuilder {
        ServerBuilder::new(binary, dir, name)
    }

    /// The first endpoint of the `listening` line (TCP when there is a TCP listener).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoints[0]
    }

    /// Every endpoint of the `listening` line, in its order.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.config.log
    }

    /// Everything the server (and its earlier incarnations) wrote to stderr so far.
    pub fn log_text(&self) -> String {
        self.config.stderr_text()
    }

    /// SIGKILL, then reap: a crash with nothing flushed or synced on the way out.
    pub fn sigkill(&mut self) -> Result<ExitStatus, ServerError> {
        if let Some(status) = self.try_status()? {
            return Ok(status);
        }
        // Not reaped yet (try_status above): the pid is still our child's.
        let _ = self.child.kill();
        self.child.wait().map_err(|source| self.wait_error(source))
    }

    /// SIGTERM, then wait up to `timeout` for the graceful shutdown to finish.
    pub fn sigterm_and_wait(&mut self, timeout: Duration) -> Result<ExitStatus, ServerError> {
        if let Some(status) = self.try_status()? {
            return Ok(status);
        }
        // Not reaped yet, as in `sigkill`; a failed send shows as the timeout below.
        let _ = spillway_sys::signal::send(self.child.id(), spillway_sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(ServerError::TermTimeout {
                    name: self.config.name.clone(),
                    timeout,
                    log: self.config.log.clone(),
                    stderr: self.log_text(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the stopped server again with the same flags, directories, log and TCP port (an
    /// ephemeral port is pinned to the one the first run got, so clients keep their endpoint).
    pub fn restart(&mut self) -> Result<(), ServerError> {
        if self.try_status()?.is_none() {
            return Err(ServerError::StillRunning {
                name: self.config.name.clone(),
                pid: self.child.id(),
            });
        }
        if let Some(Endpoint::Tcp(address)) =
            self.endpoints.iter().find(|e| matches!(e, Endpoint::Tcp(_)))
        {
            self.config.listen = address.to_string();
        }
        let (child, endpoints) = self.config.launch()?;
        self.child = child;
        self.endpoints = endpoints;
        Ok(())
    }

    fn try_status(&mut self) -> Result<Option<ExitStatus>, ServerError> {
        self.child.try_wait().map_err(|source| self.wait_error(source))
    }

    fn wait_error(&self, source: std::io::Error) -> ServerError {
        ServerError::Wait { name: self.config.name.clone(), pid: self.child.id(), source }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `a,b,c`: the comma-separated endpoint list the CLI and the test children take.
pub fn endpoint_list(endpoints: &[Endpoint]) -> String {
    endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",")
}

/// Deterministic bytes for (seed, length): xorshift64, so every test and every process agrees on
/// the content without shipping it around.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(length);
    while out.len() < length {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// Same length, same CRC32C and same bytes (the CRC is what a drain or a store would check).
pub fn same_bytes(got: &[u8], expected: &[u8]) -> bool {
    got.len() == expected.len()
        && crc32c::crc32c(got) == crc32c::crc32c(expected)
        && got == expected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seed_dependent() {
        assert_eq!(pattern(7, 1001), pattern(7, 1001));
        assert_eq!(pattern(7, 1001).len(), 1001);
        assert_eq!(pattern(7, 1001)[..500], pattern(7, 500)[..]);
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert!(same_bytes(&pattern(3, 4097), &pattern(3, 4097)));
        assert!(!same_bytes(&pattern(3, 4097), &pattern(3, 4096)));
    }

    /// Fake servers (shell scripts ignoring their flags) that fail in the two ways a real one
    /// can: a wrong first line, and silence. Both scripts are written before either is run, so no
    /// concurrent fork holds a write descriptor on them (ETXTBSY).
    #[test]
    fn servers_that_never_listen_are_reported_with_their_stderr() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let scripts = [
            ("wrong", "#!/bin/sh\necho 'bad flag --dram-bytes' >&2\necho 'not ready'\n"),
            ("silent", "#!/bin/sh\necho 'still replaying the journal' >&2\nexec sleep 30\n"),
        ];
        for (name, text) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let error =
            ServerBuilder::new(dir.path().join("wrong"), dir.path(), "w").spawn().unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, ServerError::NotListening { .. }), "{text}");
        assert!(text.contains("not ready") && text.contains("bad flag --dram-bytes"), "{text}");

        let error = ServerBuilder::new(dir.path().join("silent"), dir.path(), "s")
            .ready_timeout(Duration::from_millis(300))
            .spawn()
            .unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, ServerError::ReadyTimeout { .. }), "{text}");
        assert!(text.contains("still replaying the journal"), "{text}");
    }
}
