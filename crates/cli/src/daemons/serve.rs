//! `spillway serve`: one burst buffer server process owning one store.
//!
//! Configuration: `--config FILE` (TOML, see `spillway config-doc`), environment
//! `SPILLWAY_<SECTION>_<NAME>`, then these flags for the common knobs. When listening, prints one
//! line `listening <endpoint>…` on stdout (scripts and tests read the real port from it when
//! `--listen 127.0.0.1:0` is given); logs go to stderr. SIGTERM or SIGINT: stop accepting,
//! finish in-flight requests, sync the store, exit 0.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use spillway_config::server::CommitDurability;
use spillway_config::{Authentication, Config};
use spillway_proto::Endpoint;
use spillway_server::{Server, ServerOptions, ShutdownHandle, StoreBackend};

#[derive(clap::Args)]
pub struct Args {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP address to listen on (server.listen_address); "" for none.
    #[arg(long)]
    listen: Option<String>,
    /// Unix-domain socket to listen on (server.unix_socket_path).
    #[arg(long)]
    unix_socket: Option<String>,
    /// How TCP clients are authenticated (server.auth): none or munge.
    #[arg(long, value_parser = parse_auth)]
    auth: Option<Authentication>,
    /// munged's socket (server.munge_socket); default: libmunge's.
    #[arg(long)]
    munge_socket: Option<String>,
    /// With --auth none, allow a non-loopback TCP address anyway: peers are unauthenticated and
    /// run as nobody (logs a warning).
    #[arg(long)]
    insecure_tcp: bool,
    /// Directory of the SSD log (store.ssd_directory).
    #[arg(long)]
    ssd_dir: Option<String>,
    /// DRAM log capacity (store.dram_bytes_max), e.g. 512M, 2G.
    #[arg(long, value_parser = spillway_types::parse_size)]
    dram_bytes: Option<u64>,
    /// SSD log capacity (store.ssd_bytes_max), e.g. 64G.
    #[arg(long, value_parser = spillway_types::parse_size)]
    ssd_bytes: Option<u64>,
    /// Default commit durability (server.commit_durability): ssd or memory.
    #[arg(long, value_parser = parse_durability)]
    durability: Option<CommitDurability>,
    /// Server name for logs and status (server.server_name).
    #[arg(long)]
    name: Option<String>,
    /// This server's failure domain (server.failure_domain; default: the host name).
    #[arg(long)]
    failure_domain: Option<String>,
    /// Take data only for epochs the manager granted (server.managed); without it the first
    /// uid to create an epoch claims it.
    #[arg(long)]
    managed: bool,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// PFS directory to drain committed epochs to (drain.pfs_directory); enables the drain.
    #[arg(long)]
    pfs_dir: Option<String>,
    /// The reservation's servers in client order, comma-separated (drain.peers).
    #[arg(long)]
    drain_peers: Option<String>,
    /// This server's position in --drain-peers (drain.self_index).
    #[arg(long)]
    drain_self_index: Option<u32>,
    /// Queue every committed epoch for draining (drain.drain_after_commit).
    #[arg(long)]
    drain_after_commit: bool,
    /// shuffled or naive (drain.mode).
    #[arg(long)]
    drain_mode: Option<String>,
}

fn parse_auth(text: &str) -> Result<Authentication, String> {
    match text {
        "none" => Ok(Authentication::None),
        "munge" => Ok(Authentication::Munge),
        other => Err(format!("auth {other:?}: expected none or munge")),
    }
}

fn parse_durability(text: &str) -> Result<CommitDurability, String> {
    match text {
        "ssd" => Ok(CommitDurability::Ssd),
        "memory" => Ok(CommitDurability::Memory),
        other => Err(format!("durability {other:?}: expected ssd or memory")),
    }
}

impl Args {
    /// `--log-json` (the logging itself is set up by main, crate::logging).
    pub fn log_json(&self) -> bool {
        self.log_json
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut config = Config::load(args.config.as_deref(), std::env::vars())?;
    args.apply_to(&mut config);
    config.validate()?;
    let endpoints = listen_endpoints(&config)?;

    // Write-behind pays for itself only where commits go to SSD; a memory-durability server
    // keeps its SSD writes (and wear) for what DRAM cannot hold.
    config.store.ssd_write_behind &= config.server.commit_durability == CommitDurability::Ssd;
    let store = spillway_store::Store::open(&config.store)
        .with_context(|| format!("opening the store in {}", config.store.ssd_directory))?;
    // Counted while the store's lock on the directory is held: one start, one incarnation.
    let identity =
        spillway_server::ServerIdentity::start(std::path::Path::new(&config.store.ssd_directory))?;
    let backend = Arc::new(StoreBackend::new(store));
    let server = Server::bind_as(
        ServerOptions::from_knobs(&config.server),
        backend.clone(),
        &endpoints,
        config.server.insecure_tcp,
        identity,
    )?;
    // Which cluster (manager database) this store's data belongs to, kept beside it.
    server.attach_cluster_file(std::path::Path::new(&config.store.ssd_directory))?;
    let drainer = start_drainer(&config, &server, backend.clone())?;
    // The metadata service of the mount: namespace journals live beside the store's segments.
    server.attach_namespaces(
        std::path::Path::new(&config.store.ssd_directory).join("namespaces"),
        config.store.file_bytes_max,
    );
    let _metrics = match config.server.metrics_listen_address.as_str() {
        "" => None,
        address => {
            let metrics = spillway_metrics::serve(address, server.metrics())
                .with_context(|| format!("server.metrics_listen_address {address}"))?;
            tracing::info!(address = %metrics.local_addr(), "metrics at /metrics");
            Some(metrics)
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    spillway_sys::signal::stop_on_termination(&stop).context("installing signal handlers")?;
    let watcher = spawn_signal_watcher(Arc::clone(&stop), server.shutdown_handle());
    print_listening(&server)?;
    let result = server.run();
    stop.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    shut_down(result, drainer, backend)
}

impl Args {
    /// Overrides the loaded configuration with the flags that were given.
    fn apply_to(self, config: &mut Config) {
        if let Some(listen) = self.listen {
            config.server.listen_address = listen;
        }
        if let Some(path) = self.unix_socket {
            config.server.unix_socket_path = path;
        }
        if let Some(auth) = self.auth {
            config.server.auth = auth;
        }
        if let Some(socket) = self.munge_socket {
            config.server.munge_socket = socket;
        }
        if self.insecure_tcp {
            config.server.insecure_tcp = true;
        }
        if let Some(dir) = self.ssd_dir {
            config.store.ssd_directory = dir;
        }
        if let Some(bytes) = self.dram_bytes {
            config.store.dram_bytes_max = bytes;
        }
        if let Some(bytes) = self.ssd_bytes {
            config.store.ssd_bytes_max = bytes;
        }
        if let Some(durability) = self.durability {
            config.server.commit_durability = durability;
        }
        if let Some(name) = self.name {
            config.server.server_name = name;
        }
        if let Some(domain) = self.failure_domain {
            config.server.failure_domain = domain;
        }
        if self.managed {
            config.server.managed = true;
        }
        if let Some(dir) = self.pfs_dir {
            config.drain.pfs_directory = dir;
        }
        if let Some(peers) = self.drain_peers {
            config.drain.peers = peers;
        }
        if let Some(index) = self.drain_self_index {
            config.drain.self_index = index;
        }
        if self.drain_after_commit {
            config.drain.drain_after_commit = true;
        }
        if let Some(mode) = self.drain_mode {
            config.drain.mode = mode;
        }
    }
}

/// The endpoints to listen on: the TCP address and the Unix socket, each if configured.
fn listen_endpoints(config: &Config) -> anyhow::Result<Vec<Endpoint>> {
    let mut endpoints = Vec::new();
    if !config.server.listen_address.is_empty() {
        endpoints.push(
            config
                .server
                .listen_address
                .parse::<Endpoint>()
                .map_err(|e| anyhow::anyhow!("server.listen_address: {e}"))?,
        );
    }
    if !config.server.unix_socket_path.is_empty() {
        endpoints.push(Endpoint::Unix(config.server.unix_socket_path.clone().into()));
    }
    Ok(endpoints)
}

/// Starts the thread that shuts the server down once `stop` is set (by SIGTERM or SIGINT).
fn spawn_signal_watcher(
    stop: Arc<AtomicBool>,
    handle: ShutdownHandle,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!("signal received: shutting down gracefully");
        handle.shutdown();
    })
}

/// Prints the `listening <endpoint>…` line that scripts and tests read the real port from.
fn print_listening(server: &Server) -> anyhow::Result<()> {
    let listening: Vec<String> = server.endpoints().iter().map(|e| e.to_string()).collect();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening {}", listening.join(" "))?;
    stdout.flush()?;
    Ok(())
}

/// After the server stopped: stops the drain, then closes the store unless the run failed.
fn shut_down(
    result: Result<(), spillway_server::ServeError>,
    drainer: Option<Arc<spillway_drain::Drainer>>,
    backend: Arc<StoreBackend>,
) -> anyhow::Result<()> {
    if let Some(drainer) = drainer {
        drainer.stop(); // an unfinished drain resumes from the journal at the next start
        drop(drainer);
    }
    result?;
    match Arc::try_unwrap(backend) {
        Ok(backend) => backend.into_store().close().context("closing the store")?,
        Err(_) => tracing::warn!("store still referenced at exit; it was synced but not closed"),
    }
    Ok(())
}

/// Starts the drain to the PFS if `drain.pfs_directory` is set, and attaches it to the server.
fn start_drainer(
    config: &Config,
    server: &Server,
    backend: Arc<StoreBackend>,
) -> anyhow::Result<Option<Arc<spillway_drain::Drainer>>> {
    let knobs = &config.drain;
    if knobs.pfs_directory.is_empty() {
        return Ok(None);
    }
    let mut peers = Vec::new();
    for text in knobs.peers.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        peers.push(
            text.parse::<Endpoint>()
                .map_err(|e| anyhow::anyhow!("drain.peers entry {text:?}: {e}"))?,
        );
    }
    let self_index = if peers.is_empty() {
        peers.push(
            server
                .endpoints()
                .into_iter()
                .next()
                .context("the server has no endpoint to drain through")?,
        );
        0
    } else {
        knobs.self_index as usize
    };
    let options = spillway_drain::DrainerOptions {
        peers,
        self_index,
        stripe_bytes: knobs.stripe_bytes,
        write_bytes_max: knobs.write_bytes_max,
        default_mode: knobs.mode.parse().map_err(|e: String| anyhow::anyhow!("drain.mode: {e}"))?,
        drain_after_commit: knobs.drain_after_commit,
        ingest_bandwidth_share: knobs.ingest_bandwidth_share,
        ingest_idle_after: spillway_drain::INGEST_IDLE_AFTER,
        retry_backoff_min: Duration::from_millis(knobs.retry_backoff_ms_min),
        retry_backoff_max: Duration::from_millis(knobs.retry_backoff_ms_max),
        queued_epochs_max: knobs.queued_epochs_max as usize,
        quarantine_after_failures: knobs.quarantine_after_failures,
        server_name: config.server.server_name.clone(),
        staging_key: spillway_drain::StagingKey::load_or_create(std::path::Path::new(
            &knobs.staging_key_file,
        ))
        .with_context(|| format!("drain.staging_key_file {}", knobs.staging_key_file))?,
        munge_socket: config.server.munge_socket_path(),
    };
    let pfs = Arc::new(spillway_drain::PosixPfs::new(&knobs.pfs_directory));
    let drainer = Arc::new(
        spillway_drain::Drainer::start(
            options,
            backend,
            pfs,
            std::path::Path::new(&config.store.ssd_directory),
            Some(server.ingest_probe()),
        )
        .context("starting the drain")?,
    );
    server.attach_drain(drainer.clone());
    tracing::info!(pfs = %knobs.pfs_directory, "draining committed epochs to the PFS");
    Ok(Some(drainer))
}
