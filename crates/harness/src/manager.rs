//! A `spillway manager` child for the end-to-end tests: its socket, database and log in one
//! directory, started with umask 0 (the modes of its files are then the ones it sets itself),
//! waited for until it listens, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::Host;

/// How long a manager may take to listen.
const MANAGER_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running manager.
pub struct ManagerProcess {
    child: Child,
    /// Its API's Unix socket (`<dir>/manager.sock`).
    pub socket: PathBuf,
    /// Its database (`<dir>/state/manager.db`).
    pub db: PathBuf,
    /// Its stderr (`<dir>/manager.log`).
    pub log: PathBuf,
    /// `tcp://ADDRESS:PORT` of its TCP API, when it has one.
    tcp: Option<String>,
}

impl ManagerProcess {
    /// `binary manager` with its files in `dir` (created), `RUST_LOG=info` and the `env`
    /// variables (knobs: `SPILLWAY_MANAGER_…`). Panics, with the log, if it exits or does not
    /// listen within a minute: a test cannot go on without it.
    pub fn start(binary: &Path, dir: &Path, env: &[(&str, &str)]) -> ManagerProcess {
        ManagerProcess::start_command(Command::new(binary), binary, dir, env, None)
    }

    /// [`start`](Self::start) inside a cluster host, also serving the API on TCP at
    /// `host:port` with `manager.auth = munge` (its heartbeats and grants reach servers on
    /// other hosts with the host's `munged`). CLIs on other hosts reach it with
    /// `--manager tcp://host:port` and `SPILLWAY_MANAGER_AUTH=munge`.
    pub fn start_in_host(
        host: &Host,
        port: u16,
        binary: &Path,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> ManagerProcess {
        let mut command = host.command(binary);
        command.env("SPILLWAY_MANAGER_AUTH", "munge");
        let listen = host.socket_address(port).to_string();
        ManagerProcess::start_command(command, binary, dir, env, Some(listen))
    }

    fn start_command(
        mut command: Command,
        binary: &Path,
        dir: &Path,
        env: &[(&str, &str)],
        listen: Option<String>,
    ) -> ManagerProcess {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("manager.sock");
        let db = dir.join("state/manager.db");
        let log = dir.join("manager.log");
        command
            .args(["manager", "--socket"])
            .arg(&socket)
            .arg("--db")
            .arg(&db)
            .args(listen.iter().flat_map(|address| ["--listen", address]))
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        spillway_sys::process::with_umask(&mut command, 0);
        spillway_sys::process::die_with_parent(&mut command);
        let child = command.spawn().unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let tcp = listen.map(|address| format!("tcp://{address}"));
        let mut manager = ManagerProcess { child, socket, db, log, tcp };
        let deadline = Instant::now() + MANAGER_READY_TIMEOUT;
        while !manager.log_text().contains("spillway manager listening") {
            if let Some(status) = manager.child.try_wait().unwrap() {
                panic!("manager exited with {status}: {}", manager.log_text());
            }
            assert!(Instant::now() < deadline, "manager did not start: {}", manager.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        manager
    }

    /// `binary` (the CLI) talking to this manager, run as root (`uid` None) or as `uid` (through
    /// setpriv, with no supplementary groups), `RUST_LOG=warn`; the caller adds arguments.
    pub fn cli(&self, binary: &Path, uid: Option<u32>) -> Command {
        let mut command = match uid {
            None => Command::new(binary),
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(binary);
                c
            }
        };
        command.env("SPILLWAY_MANAGER", &self.socket).env("RUST_LOG", "warn");
        command
    }

    /// `binary` (the CLI) run inside `host` as root (`uid` None) or as `uid`, talking to this
    /// manager over its TCP API with munge when it has one (else its Unix socket, which the
    /// shared file system shows on every host), `RUST_LOG=warn`.
    pub fn cli_in_host(&self, host: &Host, binary: &Path, uid: Option<u32>) -> Command {
        let mut command = match uid {
            None => host.command(binary),
            Some(uid) => host.command_as(uid, binary),
        };
        match &self.tcp {
            Some(tcp) => command.env("SPILLWAY_MANAGER", tcp).env("SPILLWAY_MANAGER_AUTH", "munge"),
            None => command.env("SPILLWAY_MANAGER", &self.socket),
        };
        command.env("RUST_LOG", "warn");
        command
    }

    /// Stops it as an operator would (SIGTERM) and waits; panics unless it exits 0.
    pub fn stop(&mut self) {
        let pid = self.child.id();
        spillway_sys::signal::send(pid, spillway_sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "manager exit {status}: {}", self.log_text());
    }

    /// `tcp://ADDRESS:PORT` of its TCP API ([`start_in_host`](Self::start_in_host)).
    pub fn tcp_address(&self) -> Option<&str> {
        self.tcp.as_deref()
    }

    /// Its process id (a fault injector SIGKILLs it from another thread).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
