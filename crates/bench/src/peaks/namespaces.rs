//! The native target's metadata rates through the namespace service, per namespace mode: what
//! a mount's `create`, `stat` and `unlink` cost (MDTest's three phases, through
//! `RemoteNamespace`, no kernel in the path), as the planner needs them (docs/design/targets.md):
//!
//! - **striped**: every thread in one namespace (on the first server), each in its own
//!   directory — all of a job's nodes in one striped namespace, its one lock and journal;
//! - **private**: one namespace per thread (thread `i` on server `i % servers`) — the
//!   per-node namespaces of a private reservation, in parallel.
//!
//! The rate of a mode is the mean of its create, stat (lookup by name) and remove (unlink)
//! rates, each over the slowest thread. Every namespace has a fresh data epoch of its own (with
//! one tiny file, so the epoch exists): deleting that epoch at the end of the level removes the
//! namespace on the server too (docs/design/namespace.md, "Removal"). Only root may create
//! namespaces on a server; for anyone else these rates are not measured (`None`, said on
//! stderr).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use spillway_client::meta::{RemoteNamespace, RemoteOptions};
use spillway_client::Client;
use spillway_namespace::{Caller, FileKind, Ino, Namespace, ROOT_INO};
use spillway_proto::Endpoint;
use spillway_types::EpochId;

use super::native::{parallel, EpochAllocator};
use super::{aggregate, Args, Work};

/// One thread's part: its namespace, its directory there, the files it created.
struct NamespaceThread {
    namespace: Arc<RemoteNamespace>,
    directory: Ino,
    files: u64,
}

/// What one level measured through the namespace service.
pub(super) struct Measured {
    /// Metadata operations per second (striped, private); `None` when this process may not
    /// create namespaces (not root).
    pub(super) rates: Option<(f64, f64)>,
    /// The namespaces' data epochs, for the level's cleanup, which deletes them (and so the
    /// namespaces).
    pub(super) epochs: Vec<EpochId>,
}

/// Metadata operations per second at `threads` threads, striped and private.
pub(super) fn measure(
    args: &Args,
    epochs: &mut EpochAllocator,
    client: &mut Client,
    threads: usize,
) -> anyhow::Result<Measured> {
    let striped_epoch = epochs.allocate()?;
    let shared = match open(&args.servers[0], striped_epoch, threads) {
        Ok(namespace) => Arc::new(namespace),
        Err(e) if e.errno == libc::EPERM => {
            eprintln!("spillway bench peaks: namespace metadata not measured: {e} (only root may create namespaces)");
            return Ok(Measured { rates: None, epochs: Vec::new() });
        }
        Err(e) => return Err(e).context("creating the striped benchmark namespace"),
    };
    let mut used = vec![striped_epoch];
    anchor(client, striped_epoch)?;
    let mut striped = Vec::with_capacity(threads);
    for thread in 0..threads {
        let name = format!("thread-{thread}");
        let directory = shared
            .mkdir(&Caller::root(), ROOT_INO, name.as_bytes(), 0o755, 0)
            .with_context(|| format!("mkdir {name} in the striped benchmark namespace"))?
            .ino;
        striped.push(NamespaceThread { namespace: shared.clone(), directory, files: 0 });
    }
    let striped_rate = mdtest(args, &mut striped)?;
    drop(striped);

    let private_epochs = epochs.allocate_many(threads as u64)?;
    used.extend_from_slice(&private_epochs);
    let mut private = Vec::with_capacity(threads);
    for (thread, &epoch) in private_epochs.iter().enumerate() {
        let server = &args.servers[thread % args.servers.len()];
        let namespace = open(server, epoch, 1)
            .with_context(|| format!("creating private benchmark namespace {}", epoch.0))?;
        anchor(client, epoch)?;
        private.push(NamespaceThread {
            namespace: Arc::new(namespace),
            directory: ROOT_INO,
            files: 0,
        });
    }
    let private_rate = mdtest(args, &mut private)?;
    Ok(Measured { rates: Some((striped_rate, private_rate)), epochs: used })
}

/// A fresh namespace on `server` whose id and data epoch are `epoch` (epoch numbers of a run
/// are fresh and far above the manager's namespace ids, which count from 1).
fn open(
    server: &Endpoint,
    epoch: EpochId,
    connections: usize,
) -> Result<RemoteNamespace, spillway_namespace::MetaError> {
    let options = RemoteOptions {
        create: true,
        data_epoch: epoch,
        root_uid: 0,
        root_gid: 0,
        root_mode: 0o755,
        connections_max: connections,
        ..RemoteOptions::default()
    };
    RemoteNamespace::open(server, epoch.0, &options)
}

/// One byte in `epoch`, so that the servers know the epoch and its deletion finds it.
fn anchor(client: &mut Client, epoch: EpochId) -> anyhow::Result<()> {
    let mut file = client.create_file(epoch, "spillway-bench-peaks")?;
    client.write(&mut file, 0, b"x")?;
    client.flush().with_context(|| format!("anchoring benchmark epoch {}", epoch.0))
}

/// Create, stat and remove, each bounded by the files per thread and the phase's time; the
/// mean of the three aggregate rates.
fn mdtest(args: &Args, threads: &mut [NamespaceThread]) -> anyhow::Result<f64> {
    let deadline = Duration::from_secs_f64(args.phase_seconds);
    let caller = Caller::root();
    let create = aggregate(&parallel(threads, |_, t| {
        let started = Instant::now();
        while t.files < args.metadata_files_per_thread && started.elapsed() < deadline {
            let name = format!("f{}", t.files);
            t.namespace
                .create(&caller, t.directory, name.as_bytes(), FileKind::Regular, 0o644, 0, 0, true)
                .with_context(|| format!("create {name}"))?;
            t.files += 1;
        }
        Ok(Work { units: t.files, seconds: started.elapsed().as_secs_f64() })
    })?);
    let stat = aggregate(&parallel(threads, |_, t| {
        let started = Instant::now();
        let mut done = 0;
        while done < t.files && started.elapsed() < deadline {
            t.namespace
                .lookup(&caller, t.directory, format!("f{done}").as_bytes())
                .with_context(|| format!("stat f{done}"))?;
            done += 1;
        }
        Ok(Work { units: done, seconds: started.elapsed().as_secs_f64() })
    })?);
    let remove = aggregate(&parallel(threads, |_, t| {
        let started = Instant::now();
        let mut done = 0;
        while done < t.files && started.elapsed() < deadline {
            t.namespace
                .unlink(&caller, t.directory, format!("f{done}").as_bytes())
                .with_context(|| format!("unlink f{done}"))?;
            done += 1;
        }
        Ok(Work { units: done, seconds: started.elapsed().as_secs_f64() })
    })?);
    Ok((create + stat + remove) / 3.0)
}
