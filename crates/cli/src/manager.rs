//! `spillway manager`: runs the control plane in the foreground.
//!
//! Loads the `[manager]` section (file, then `SPILLWAY_MANAGER_*` environment, then these
//! flags), opens the SQLite database, starts the heartbeat and serves the HTTP/JSON API on the
//! Unix socket (and loopback TCP if configured) until SIGTERM or SIGINT. Prints one
//! `spillway manager listening <endpoint>` line per listener on stderr once it accepts
//! requests, which scripts and tests wait for.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Also serve the API on this loopback TCP address (manager.listen_address).
    #[arg(long)]
    listen: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
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
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !STOP.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            stop.store(true, Ordering::SeqCst);
        })
    };
    let database = knobs.database_path.clone();
    let result = spillway_manager::run_daemon(knobs, Arc::clone(&stop), &|endpoint| {
        eprintln!("spillway manager listening {endpoint} (database {database})");
    });
    stop.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    result.map_err(|e| anyhow::anyhow!("spillway manager: {e}"))?;
    tracing::info!("manager stopped");
    Ok(())
}
