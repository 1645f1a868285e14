//! `spillway drain`: ask the servers of a reservation to drain an epoch to the PFS, wait for it,
//! or show where every drain stands.
//!
//! `start` queues the epoch on every server holding it (each server's drainer does the work in
//! the background); `wait` polls every server's drain status until the epoch is drained on all
//! of them (or a timeout), printing retries as they happen; `status` prints one line per
//! (server, epoch) (`--json`: one document), asking each server on its own so that one that
//! does not answer (a lost host) is listed as unreachable while the others are shown. Exit status is non-zero when `wait` times out.

use std::time::{Duration, Instant};

use anyhow::Context;
use spillway_client::{Client, ClientOptions};
use spillway_proto::{DrainState, Endpoint};
use spillway_types::EpochId;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    /// The reservation's servers, comma-separated (tcp://IP:PORT or unix:///PATH), in order.
    #[arg(long, global = true, value_delimiter = ',')]
    servers: Vec<String>,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Queue a drain of a committed epoch on every server holding it.
    Start {
        epoch: u64,
        /// shuffled (coordinated shuffling) or naive.
        #[arg(long, default_value = "shuffled")]
        mode: String,
        /// Also wait until it is drained.
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
    },
    /// Wait until the epoch is drained on every server that knows of it.
    Wait {
        epoch: u64,
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
    },
    /// Drain state of every epoch on every server; a server that does not answer (a lost
    /// host) is listed as unreachable and the others are shown.
    Status {
        /// One JSON document: per server its epochs' drain states, or why it is unreachable.
        #[arg(long)]
        json: bool,
    },
    /// Mark DIR as the PFS directory drains write to (administrators, once per file system,
    /// as root, after mounting it): writes DIR/.spillway-pfs with a random id and DIR's device.
    /// A drain writes nothing where this marker is missing, foreign or on another device (an
    /// unmounted PFS). Keeps a valid marker of the same device.
    MarkPfs { dir: std::path::PathBuf },
}

fn connect(servers: &[String]) -> anyhow::Result<Client> {
    anyhow::ensure!(!servers.is_empty(), "give the reservation's servers with --servers");
    let endpoints = servers
        .iter()
        .map(|s| s.parse::<Endpoint>().map_err(|e| anyhow::anyhow!("--servers: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let options =
        ClientOptions { client_name: "spillway drain".into(), ..ClientOptions::default() };
    Client::connect(&endpoints, options).context("connecting to the servers")
}

/// Polls until `epoch` is drained on every server that knows it. Returns the seconds waited.
pub fn wait_drained(
    client: &mut Client,
    epoch: EpochId,
    timeout: Duration,
    verbose: bool,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut last_report = String::new();
    loop {
        let status = client.drain_status()?;
        let mut known = 0;
        let mut done = 0;
        let mut report = String::new();
        for (server, list) in &status {
            if let Some(d) = list.iter().find(|d| d.epoch == epoch) {
                known += 1;
                if d.state == DrainState::Drained {
                    done += 1;
                } else if d.state == DrainState::Quarantined {
                    anyhow::bail!(
                        "epoch {epoch} is quarantined on server {server} ({} failed attempts): \
                         {} (the data stays in the burst buffer; `spillway drain start {epoch}` \
                         retries)",
                        d.failed_attempts,
                        d.last_error
                    );
                } else if !d.last_error.is_empty() {
                    report.push_str(&format!(
                        "server {server}: {} ({} failed attempts): {}\n",
                        d.state, d.failed_attempts, d.last_error
                    ));
                }
            }
        }
        if known > 0 && known == done {
            return Ok(started.elapsed().as_secs_f64());
        }
        if verbose && report != last_report && !report.is_empty() {
            eprint!("{report}");
            last_report = report;
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "epoch {epoch} not drained after {:?}: {done} of {known} servers done",
            timeout
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Action::MarkPfs { dir } = &args.action {
        let marker = spillway_drain::pfs::mark_pfs(dir)
            .with_context(|| format!("marking {} as the PFS", dir.display()))?;
        println!("{}: PFS marker {} (device {})", dir.display(), marker.id, marker.device);
        return Ok(());
    }
    if let Action::Status { json } = &args.action {
        return status(&args.servers, *json);
    }
    let mut client = connect(&args.servers)?;
    match args.action {
        Action::Start { epoch, mode, wait, timeout_s } => {
            let mode: spillway_drain::DrainMode =
                mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let queued = client.request_drain(EpochId(epoch), mode.code())?;
            anyhow::ensure!(queued > 0, "no server holds epoch {epoch}");
            println!("epoch {epoch}: drain ({mode}) queued on {queued} servers");
            if wait {
                let seconds = wait_drained(
                    &mut client,
                    EpochId(epoch),
                    Duration::from_secs(timeout_s),
                    true,
                )?;
                println!("epoch {epoch}: drained on every server in {seconds:.2} s");
            }
        }
        Action::Wait { epoch, timeout_s } => {
            let seconds =
                wait_drained(&mut client, EpochId(epoch), Duration::from_secs(timeout_s), true)?;
            println!("epoch {epoch}: drained on every server ({seconds:.2} s waited)");
        }
        Action::MarkPfs { .. } => {} // done above, without servers
        Action::Status { .. } => {}  // done above, server by server
    }
    Ok(())
}

/// `drain status`: each server asked on its own, so one that does not answer (a lost host) is
/// reported as such and the others' drains (which name it in their errors) are still shown.
fn status(servers: &[String], json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(!servers.is_empty(), "give the reservation's servers with --servers");
    let mut answers = Vec::new();
    for (position, server) in servers.iter().enumerate() {
        let answer = connect(std::slice::from_ref(server)).and_then(|mut client| {
            let mut lists = client.drain_status()?;
            Ok(lists.pop().map(|(_, list)| list).unwrap_or_default())
        });
        answers.push((position, server, answer.map_err(|e| format!("{e:#}"))));
    }
    anyhow::ensure!(
        answers.iter().any(|(_, _, a)| a.is_ok()),
        "no server answers: {}",
        answers
            .iter()
            .filter_map(|(_, server, a)| a.as_ref().err().map(|e| format!("{server}: {e}")))
            .collect::<Vec<_>>()
            .join("; ")
    );
    if json {
        println!("{}", serde_json::to_string_pretty(&status_json(&answers))?);
        return Ok(());
    }
    println!(
        "{:>6} {:>8} {:>9} {:>8} {:>11} {:>12} {:>8} {:>9} {:>9}  last error",
        "server", "epoch", "state", "mode", "files", "pfs_bytes", "writes", "shuffle_s", "flush_s"
    );
    for (server, endpoint, answer) in &answers {
        let list = match answer {
            Ok(list) => list,
            Err(error) => {
                println!("{server:>6} unreachable ({endpoint}): {error}");
                continue;
            }
        };
        for d in list {
            println!(
                "{server:>6} {:>8} {:>9} {:>8} {:>5}/{:<5} {:>12} {:>8} {:>9.3} {:>9.3}  {}",
                d.epoch.0,
                d.state.to_string(),
                mode_name(d.mode),
                d.files_done,
                d.files_total,
                d.pfs_bytes_written,
                d.pfs_write_calls,
                d.shuffle_us as f64 / 1e6,
                d.flush_us as f64 / 1e6,
                if d.failed_attempts > 0 {
                    format!("({} failed) {}", d.failed_attempts, d.last_error)
                } else {
                    d.last_error.clone()
                },
            );
        }
    }
    Ok(())
}

type StatusAnswer<'a> = (usize, &'a String, Result<Vec<spillway_proto::DrainInfo>, String>);

fn status_json(answers: &[StatusAnswer<'_>]) -> serde_json::Value {
    let servers: Vec<serde_json::Value> = answers
        .iter()
        .map(|(server, endpoint, answer)| match answer {
            Err(error) => serde_json::json!({
                "server": server, "endpoint": endpoint, "unreachable": error,
            }),
            Ok(list) => serde_json::json!({
                "server": server,
                "endpoint": endpoint,
                "epochs": list.iter().map(|d| serde_json::json!({
                    "epoch": d.epoch.0,
                    "state": d.state.to_string(),
                    "mode": mode_name(d.mode),
                    "files_done": d.files_done,
                    "files_total": d.files_total,
                    "pfs_bytes_written": d.pfs_bytes_written,
                    "pfs_write_calls": d.pfs_write_calls,
                    "shuffle_s": d.shuffle_us as f64 / 1e6,
                    "flush_s": d.flush_us as f64 / 1e6,
                    "failed_attempts": d.failed_attempts,
                    "last_error": d.last_error,
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    serde_json::json!({ "servers": servers })
}

fn mode_name(code: u8) -> String {
    spillway_drain::DrainMode::from_code(code).map(|m| m.to_string()).unwrap_or_default()
}
