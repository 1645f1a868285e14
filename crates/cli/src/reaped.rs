//! Child processes owned by a benchmark: killed when dropped, so a failed measurement never
//! leaves servers or load generators behind; and the one way benchmarks start a server.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Dropping it sends SIGTERM (a server then syncs and leaves nothing half-done), waits up to
/// 30 s, then SIGKILLs and reaps.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            // Not reaped yet (try_wait above), so the pid is still our child's.
            let _ = spillway_sys::signal::send(self.0.id(), spillway_sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && self.0.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `spillway serve` on a loopback port with its SSD log in `ssd_dir`, its log in
/// `<work>/server-<name>.log` and the extra `args`; returns it with the endpoint it printed.
pub fn start_server(
    work: &Path,
    name: &str,
    ssd_dir: &Path,
    args: &[String],
) -> anyhow::Result<(Reaped, String)> {
    let log_path = work.join(format!("server-{name}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--ssd-dir")
        .arg(ssd_dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting spillway serve")?;
    let stdout = child.stdout.take().expect("piped");
    let server = Reaped(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let endpoint = line
        .strip_prefix("listening ")
        .and_then(|l| l.split_whitespace().next())
        .with_context(|| format!("server {name} did not start (see {})", log_path.display()))?
        .to_string();
    Ok((server, endpoint))
}
