//! One way to run a real `spillway serve` process: spawn it with the flags of its scenario, wait
//! for its `listening <endpoint>…` line (bounded, with the server's stderr in the error when it
//! never comes), signal it, restart it on the same directories and port, read its log, and never
//! leave it behind: it is killed when its [`ServerProcess`] is dropped, and by the kernel when
//! this process dies first (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use spillway_proto::Endpoint;

use crate::cluster::Host;

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
    #[error("server {name}: `spillway drain mark-pfs {dir}` failed: {problem}")]
    MarkPfs { name: String, dir: PathBuf, problem: String },
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
    /// `Some`: dropping the process sends SIGTERM and waits this long before SIGKILL.
    graceful_drop: Option<Duration>,
    /// `Some`: the server runs inside this cluster host.
    host: Option<Host>,
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
            graceful_drop: None,
            host: None,
        }
    }

    /// Runs the server inside a cluster host, as a site would on a burst buffer node: TCP on
    /// the host's address (ephemeral port; [`listen`](Self::listen) may name one), `--auth
    /// munge` through the host's `munged`, SSD directory `<host's SSD directory>/<name>` (gone
    /// with the host when it is removed for good).
    pub fn in_host(mut self, host: &Host) -> Self {
        self.listen = host.socket_address(0).to_string();
        self.ssd_dir = host.ssd_dir().join(&self.name);
        self.extra_args.extend(["--auth".into(), "munge".into()]);
        self.host = Some(host.clone());
        self
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
        self.drain = Some((crate::endpoint_list(peers), self_index));
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

    /// `RUST_LOG` for the server (inherited from this process when not set).
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

    /// When the [`ServerProcess`] is dropped, SIGTERM it (a server then syncs its store and
    /// leaves nothing half-done) and wait up to `timeout` before SIGKILL. The default is SIGKILL.
    pub fn graceful_drop(mut self, timeout: Duration) -> Self {
        self.graceful_drop = Some(timeout);
        self
    }

    /// Spawns the server and waits for its `listening` line.
    pub fn spawn(self) -> Result<ServerProcess, ServerError> {
        let launched = self.launch()?;
        Ok(ServerProcess {
            child: launched.child,
            endpoints: launched.endpoints,
            startup: launched.startup,
            _stdout: launched.stdout,
            config: self,
        })
    }

    /// [`spawn`](Self::spawn), panicking with the error (which carries the server's stderr).
    #[track_caller]
    pub fn start(self) -> ServerProcess {
        self.spawn().unwrap_or_else(|error| panic!("{error}"))
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Spawns the process and waits for its endpoints; a child that fails to get there is
    /// killed and reaped before the error returns.
    fn launch(&self) -> Result<Launched, ServerError> {
        let started = Instant::now();
        let mut child = self.command()?.spawn().map_err(|source| ServerError::Spawn {
            name: self.name.clone(),
            binary: self.binary.clone(),
            source,
        })?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let endpoints = self.read_endpoints(stdout);
        let startup = started.elapsed();
        match endpoints {
            Ok((endpoints, stdout)) => Ok(Launched { child, endpoints, startup, stdout }),
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(error)
            }
        }
    }

    /// Marks the PFS directory as a center's administrator does once (`spillway drain
    /// mark-pfs`): a drain writes only into a marked directory. The one place every
    /// harness-started server (tests, demo, benchmarks) gets its PFS set up; idempotent.
    fn mark_pfs(&self, dir: &Path) -> Result<(), ServerError> {
        let failed = |problem: String| ServerError::MarkPfs {
            name: self.name.clone(),
            dir: dir.to_path_buf(),
            problem,
        };
        // In the server's host: a shared PFS is mounted there, not where the harness runs.
        let mut command = match &self.host {
            Some(host) => host.command(&self.binary),
            None => Command::new(&self.binary),
        };
        let output = command
            .args(["drain", "mark-pfs"])
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(e.to_string()))?;
        if !output.status.success() {
            return Err(failed(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The `spillway serve` command line, environment and standard streams of this server.
    fn command(&self) -> Result<Command, ServerError> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).map_err(
            |source| ServerError::Log { name: self.name.clone(), log: self.log.clone(), source },
        )?;
        // exec.sh ends in nsenter, which execs the server: the child is the server itself.
        let mut command = match &self.host {
            Some(host) => host.command(&self.binary),
            None => Command::new(&self.binary),
        };
        command.args([
            "serve",
            "--listen",
            &self.listen,
            "--dram-bytes",
            &self.dram_bytes,
            "--name",
            &self.name,
        ]);
        if let Some(socket) = &self.unix_socket {
            // A socket left by a killed predecessor would make the bind fail.
            let _ = std::fs::remove_file(socket);
            command.arg("--unix-socket").arg(socket);
        }
        command.arg("--ssd-dir").arg(&self.ssd_dir);
        if let Some(pfs) = &self.pfs_dir {
            // A missing directory stands for a PFS not mounted yet (tests): left unmarked.
            if pfs.is_dir() {
                self.mark_pfs(pfs)?;
            }
            command.arg("--pfs-dir").arg(pfs);
        }
        if let Some((peers, index)) = &self.drain {
            command.args(["--drain-peers", peers, "--drain-self-index", &index.to_string()]);
        }
        if let Some(durability) = &self.durability {
            command.args(["--durability", durability]);
        }
        command.args(&self.extra_args).envs(self.env.iter().map(|(k, v)| (k, v)));
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
        spillway_sys::process::die_with_parent(&mut command);
        Ok(command)
    }

    /// The endpoints of the first stdout line, read on a thread so that a hung server cannot
    /// hang the caller; the reader is returned so the server never writes into a closed pipe.
    fn read_endpoints(
        &self,
        stdout: ChildStdout,
    ) -> Result<(Vec<Endpoint>, BufReader<ChildStdout>), ServerError> {
        let (sender, receiver) = mpsc::sync_channel(1);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = sender.send((line, reader));
        });
        let Ok((line, reader)) = receiver.recv_timeout(self.ready_timeout) else {
            return Err(ServerError::ReadyTimeout {
                name: self.name.clone(),
                timeout: self.ready_timeout,
                log: self.log.clone(),
                stderr: self.stderr_text(),
            });
        };
        Ok((self.parse_listening_line(&line)?, reader))
    }

    /// `listening E1 E2 …` → the endpoints, or an error carrying the server's stderr.
    fn parse_listening_line(&self, line: &str) -> Result<Vec<Endpoint>, ServerError> {
        let not_listening = || ServerError::NotListening {
            name: self.name.clone(),
            line: line.to_string(),
            log: self.log.clone(),
            stderr: self.stderr_text(),
        };
        let rest = line.strip_prefix("listening ").ok_or_else(not_listening)?;
        let endpoints = rest
            .split_whitespace()
            .map(|text| {
                text.parse::<Endpoint>().map_err(|problem| ServerError::BadEndpoint {
                    name: self.name.clone(),
                    text: text.to_string(),
                    problem,
                    log: self.log.clone(),
                    stderr: self.stderr_text(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(not_listening());
        }
        Ok(endpoints)
    }
}

/// A server that printed its endpoints.
struct Launched {
    child: Child,
    endpoints: Vec<Endpoint>,
    startup: Duration,
    stdout: BufReader<ChildStdout>,
}

/// A running (or stopped, awaiting [`restart`](Self::restart)) `spillway serve` child; killed and
/// reaped when dropped, so a failing test or benchmark leaves no server behind.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    endpoints: Vec<Endpoint>,
    startup: Duration,
    /// Kept open so that the server never writes into a closed pipe.
    _stdout: BufReader<ChildStdout>,
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

    /// From spawn to the `listening` line of the latest start (includes store recovery).
    pub fn startup(&self) -> Duration {
        self.startup
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
        let launched = self.config.launch()?;
        self.child = launched.child;
        self.endpoints = launched.endpoints;
        self.startup = launched.startup;
        self._stdout = launched.stdout;
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
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        if let Some(timeout) = self.config.graceful_drop {
            let _ = self.sigterm_and_wait(timeout);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A fake server that reports its endpoint and then ignores SIGTERM for a moment, recording
    /// it: a graceful drop delivers SIGTERM and waits, the default drop does not.
    #[test]
    fn a_graceful_drop_sends_sigterm_first() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("got-term");
        let script = dir.path().join("server");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ntrap 'touch {}; exit 0' TERM\necho 'listening 127.0.0.1:9'\n\
                 while true; do sleep 0.05; done\n",
                marker.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let server = ServerBuilder::new(&script, dir.path(), "g").start();
        assert_eq!(server.endpoint(), &"127.0.0.1:9".parse::<Endpoint>().unwrap());
        drop(server);
        assert!(!marker.exists(), "the default drop is SIGKILL");
        let server =
            ServerBuilder::new(&script, dir.path(), "g").graceful_drop(Duration::from_secs(10));
        drop(server.start());
        assert!(marker.exists(), "a graceful drop sends SIGTERM and waits for the exit");
    }
}
