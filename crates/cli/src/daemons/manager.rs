//! `spillway manager`: runs the control plane in the foreground.
//!
//! Loads the `[manager]` section (file, then `SPILLWAY_MANAGER_*` environment, then these
//! flags), opens the SQLite database, starts the heartbeat and serves the HTTP/JSON API on the
//! Unix socket (and loopback TCP if configured) until SIGTERM or SIGINT. Prints one
//! `spillway manager listening <endpoint>` line per listener on stderr once it accepts
//! requests, which scripts and tests wait for.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// TOML configuration file (the `[manager]` section is used).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Unix socket of the API (manager.socket_path).
    #[arg(long)]
    socket: Option<String>,
    /// SQLite database (manager.database_path).
    #[arg(long)]
    db: Option<String>,
    /// Also serve the API on this TCP address (manager.listen_address; loopback only unless
    /// manager.auth = munge).
    #[arg(long)]
    listen: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

impl Args {
    /// `--log-json` (the logging itself is set up by main, crate::logging).
    pub fn log_json(&self) -> bool {
        self.log_json
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = spillway_config::Config::load(args.config.as_deref(), std::env::vars())?;
    let mut knobs = config.manager;
    if let Some(socket) = args.socket {
        knobs.socket_path = socket;
    }
    if let Some(db) = args.db {
        knobs.database_path = db;
    }
    if let Some(listen) = args.listen {
        knobs.listen_address = listen;
    }
    knobs.validate()?;
    let stop = Arc::new(AtomicBool::new(false));
    spillway_sys::signal::stop_on_termination(&stop)
        .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
    let database = knobs.database_path.clone();
    let result = spillway_manager::run_daemon(knobs, Arc::clone(&stop), &|endpoint| {
        eprintln!("spillway manager listening {endpoint} (database {database})");
    });
    result.map_err(|e| anyhow::anyhow!("spillway manager: {e}"))?;
    tracing::info!("manager stopped");
    Ok(())
}
