//! The native target of `spillway bench peaks`: a reservation's servers driven through the
//! client library, so the figures are what an application linked against `spillway-client` sees
//! (no kernel, no FUSE in the path). Same phases, levels, bounds and output as the directory
//! target; each thread has its own [`Client`] (its own connections), like one MPI rank.
//!
//! How the phases map onto the checkpoint API:
//! - write bandwidth: `create_file` in the thread's data epoch, sequential `write`s of
//!   `--transfer-kib`, then `commit_epoch` at `--commit-durability` (IOR's write + fsync);
//! - read bandwidth: sequential `read`s of what was written, after the commit;
//! - write IOPS: random 4 KiB `write`s into a file of a second (never committed) epoch; writes
//!   are pipelined and the phase ends with `flush` (every write acknowledged by a server);
//! - read IOPS: random 4 KiB `read`s of the committed data file (one round trip each);
//! - MDTest: create = `create_file` in the thread's metadata epoch; stat = `open_file` +
//!   `file_size` (a lookup by name, as `stat(path)` is); list = `list_files` of the epoch;
//!   remove = `delete_epoch`, the API's only remove: before the timed phase each thread puts
//!   one file in each of as many fresh epochs as it created files, and the phase deletes those
//!   epochs one request at a time — so the rate is per remove request, as MDTest's unlink is,
//!   not the inflated "files per second" of deleting one epoch that holds them all.
//!
//! Epoch numbers: fresh ones for every run, starting above both the highest epoch any server
//! lists and the current time in microseconds (a deleted epoch is not listed but cannot be
//! reused; a run uses far fewer epochs than the microseconds it lasts, so runs never collide).
//! Every epoch the run used is deleted at the end, also when a phase fails.

use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_client::{Client, ClientOptions, FileHandle};
use spillway_proto::Endpoint;
use spillway_types::EpochId;

use super::{aggregate, thread_levels, Args, Level, Work};

/// Measures every concurrency level against `args.servers`; deletes the epochs it used.
pub(super) fn measure(args: &Args) -> anyhow::Result<Vec<Level>> {
    let mut epochs = EpochAllocator::new(args)?;
    let result = thread_levels(args.threads_max)
        .into_iter()
        .map(|threads| measure_level(args, &mut epochs, threads))
        .collect::<anyhow::Result<Vec<_>>>();
    if result.is_err() {
        epochs.delete_leftovers(args);
    }
    result
}

fn servers_text(servers: &[Endpoint]) -> String {
    servers.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

fn client_options(args: &Args, name: String) -> ClientOptions {
    ClientOptions {
        durability: args.commit_durability.protocol(),
        replicas: args.replicas,
        client_name: name,
        ..ClientOptions::default()
    }
}

fn connect(args: &Args, name: String) -> anyhow::Result<Client> {
    Client::connect(&args.servers, client_options(args, name))
        .with_context(|| format!("connecting to servers {}", servers_text(&args.servers)))
}

/// Hands out fresh epoch numbers and remembers those not yet deleted.
pub(super) struct EpochAllocator {
    next: u64,
    /// Epochs handed out whose level has not cleaned up yet.
    outstanding: Vec<EpochId>,
}

impl EpochAllocator {
    fn new(args: &Args) -> anyhow::Result<EpochAllocator> {
        let mut client = connect(args, "spillway bench peaks (setup)".into())?;
        let listed_max = client
            .list_epochs()
            .with_context(|| format!("listing epochs on {}", servers_text(&args.servers)))?
            .iter()
            .map(|summary| summary.epoch.0)
            .max()
            .unwrap_or(0);
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_micros() as u64)
            .unwrap_or(0);
        Ok(EpochAllocator {
            next: listed_max.max(now_us).saturating_add(1),
            outstanding: Vec::new(),
        })
    }

    pub(super) fn allocate(&mut self) -> anyhow::Result<EpochId> {
        Ok(self.allocate_many(1)?[0])
    }

    /// `count` consecutive fresh epochs.
    pub(super) fn allocate_many(&mut self, count: u64) -> anyhow::Result<Vec<EpochId>> {
        let first = self.next;
        self.next = self
            .next
            .checked_add(count)
            .context("epoch numbers exhausted (a server lists an epoch near u64::MAX)")?;
        let epochs: Vec<EpochId> = (first..self.next).map(EpochId).collect();
        self.outstanding.extend_from_slice(&epochs);
        Ok(epochs)
    }

    /// After a failure: best effort, so the reservation is not left holding benchmark data.
    fn delete_leftovers(&mut self, args: &Args) {
        let Ok(mut client) = connect(args, "spillway bench peaks (cleanup)".into()) else {
            return;
        };
        for epoch in self.outstanding.drain(..) {
            let _ = client.delete_epoch(epoch);
        }
    }
}

/// One thread's client and what earlier phases of its level left for later ones.
struct ThreadState {
    client: Client,
    data_epoch: EpochId,
    iops_epoch: EpochId,
    metadata_epoch: EpochId,
    /// Fresh epochs for the remove phase (one file each), at least as many as files created.
    remove_epochs: Vec<EpochId>,
    /// The bandwidth file and the bytes written to it.
    data: Option<(FileHandle, u64)>,
    /// Files the create phase made in the metadata epoch (and remove epochs prepared).
    metadata_files: u64,
    /// Remove epochs the remove phase deleted.
    removed: u64,
}

/// Runs `body` on one thread per state, released together; each returns its work.
pub(super) fn parallel<S, F>(states: &mut [S], body: F) -> anyhow::Result<Vec<Work>>
where
    S: Send,
    F: Fn(usize, &mut S) -> anyhow::Result<Work> + Sync,
{
    let barrier = Barrier::new(states.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(thread, state)| {
                let (barrier, body) = (&barrier, &body);
                scope.spawn(move || {
                    barrier.wait();
                    body(thread, state)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("benchmark thread panicked"))
            .collect()
    })
}

struct Phases<'a> {
    args: &'a Args,
    deadline: Duration,
}

impl Phases<'_> {
    fn data_name(thread: usize) -> String {
        format!("bandwidth.{thread}")
    }

    fn write_bandwidth(&self, thread: usize, state: &mut ThreadState) -> anyhow::Result<Work> {
        let name = Self::data_name(thread);
        let epoch = state.data_epoch;
        let transfer = (self.args.transfer_kib << 10) as usize;
        let total = self.args.file_mib_per_thread << 20;
        let block = vec![0xA5u8; transfer];
        let started = Instant::now();
        let mut file = state
            .client
            .create_file(epoch, &name)
            .with_context(|| format!("creating {name} in epoch {}", epoch.0))?;
        let mut written = 0u64;
        while written < total && started.elapsed() < self.deadline * 4 {
            let length = transfer.min((total - written) as usize);
            state.client.write(&mut file, written, &block[..length]).with_context(|| {
                format!("writing {name} of epoch {} at offset {written}", epoch.0)
            })?;
            written += length as u64;
        }
        state
            .client
            .commit_epoch(epoch)
            .with_context(|| format!("committing epoch {} ({name})", epoch.0))?;
        let seconds = started.elapsed().as_secs_f64();
        state.data = Some((file, written));
        Ok(Work { units: written, seconds })
    }

    fn read_bandwidth(&self, thread: usize, state: &mut ThreadState) -> anyhow::Result<Work> {
        let name = Self::data_name(thread);
        let (file, size) =
            state.data.as_ref().context("read bandwidth phase before the write phase")?;
        let mut block = vec![0u8; (self.args.transfer_kib << 10) as usize];
        let started = Instant::now();
        let mut read = 0u64;
        while read < *size && started.elapsed() < self.deadline * 4 {
            let length = block.len().min((size - read) as usize);
            state.client.read(file, read, &mut block[..length]).with_context(|| {
                format!("reading {name} of epoch {} at offset {read}", file.epoch.0)
            })?;
            read += length as u64;
        }
        Ok(Work { units: read, seconds: started.elapsed().as_secs_f64() })
    }

    fn write_iops(&self, thread: usize, state: &mut ThreadState) -> anyhow::Result<Work> {
        let name = format!("iops.{thread}");
        let epoch = state.iops_epoch;
        let transfer = self.args.small_transfer_bytes;
        let slots = ((self.args.file_mib_per_thread << 20) / transfer).max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(1 ^ thread as u64);
        let buffer = vec![0x5Au8; transfer as usize];
        let mut file = state
            .client
            .create_file(epoch, &name)
            .with_context(|| format!("creating {name} in epoch {}", epoch.0))?;
        let started = Instant::now();
        let mut operations = 0u64;
        const OPERATIONS_MAX: u64 = 10_000_000;
        while operations < OPERATIONS_MAX {
            for _ in 0..64 {
                let offset = rng.gen_range(0..slots) * transfer;
                state
                    .client
                    .write(&mut file, offset, &buffer)
                    .and_then(|()| {
                        if self.args.sync_small_writes {
                            state.client.flush()
                        } else {
                            Ok(())
                        }
                    })
                    .with_context(|| {
                        format!("writing {name} of epoch {} at offset {offset}", epoch.0)
                    })?;
                operations += 1;
            }
            if started.elapsed() >= self.deadline {
                break;
            }
        }
        state
            .client
            .flush()
            .with_context(|| format!("waiting for the writes to {name} of epoch {}", epoch.0))?;
        Ok(Work { units: operations, seconds: started.elapsed().as_secs_f64() })
    }

    fn read_iops(&self, thread: usize, state: &mut ThreadState) -> anyhow::Result<Work> {
        let name = Self::data_name(thread);
        let (file, size) = state.data.as_ref().context("read IOPS phase before the write phase")?;
        let transfer = self.args.small_transfer_bytes;
        let slots = size / transfer;
        if slots == 0 {
            bail!("{name} holds {size} bytes, less than one {transfer}-byte transfer");
        }
        let mut rng = ChaCha8Rng::seed_from_u64(2 ^ thread as u64);
        let mut buffer = vec![0u8; transfer as usize];
        let started = Instant::now();
        let mut operations = 0u64;
        const OPERATIONS_MAX: u64 = 10_000_000;
        while operations < OPERATIONS_MAX {
            for _ in 0..64 {
                let offset = rng.gen_range(0..slots) * transfer;
                state.client.read(file, offset, &mut buffer).with_context(|| {
                    format!("reading {name} of epoch {} at offset {offset}", file.epoch.0)
                })?;
                operations += 1;
            }
            if started.elapsed() >= self.deadline {
                break;
            }
        }
        Ok(Work { units: operations, seconds: started.elapsed().as_secs_f64() })
    }

    fn create(&self, state: &mut ThreadState) -> anyhow::Result<Work> {
        let epoch = state.metadata_epoch;
        let started = Instant::now();
        let mut created = 0u64;
        while created < self.args.metadata_files_per_thread {
            let name = format!("f{created}");
            state
                .client
                .create_file(epoch, &name)
                .with_context(|| format!("creating {name} in epoch {}", epoch.0))?;
            created += 1;
            if created.is_multiple_of(64) && started.elapsed() >= self.deadline {
                break;
            }
        }
        state.metadata_files = created;
        Ok(Work { units: created, seconds: started.elapsed().as_secs_f64() })
    }

    fn stat(&self, state: &mut ThreadState) -> anyhow::Result<Work> {
        let epoch = state.metadata_epoch;
        let started = Instant::now();
        let mut done = 0u64;
        while done < state.metadata_files {
            let name = format!("f{done}");
            let file = state
                .client
                .open_file(epoch, &name)
                .with_context(|| format!("looking up {name} in epoch {}", epoch.0))?;
            state
                .client
                .file_size(&file)
                .with_context(|| format!("stat of {name} in epoch {}", epoch.0))?;
            done += 1;
            if done.is_multiple_of(64) && started.elapsed() >= self.deadline {
                break;
            }
        }
        Ok(Work { units: done, seconds: started.elapsed().as_secs_f64() })
    }

    fn list(&self, state: &mut ThreadState) -> anyhow::Result<Work> {
        let epoch = state.metadata_epoch;
        let started = Instant::now();
        let mut listed = 0u64;
        loop {
            let files = state
                .client
                .list_files(epoch)
                .with_context(|| format!("listing epoch {}", epoch.0))?;
            if files.len() as u64 != state.metadata_files {
                bail!(
                    "listing epoch {} on {} found {} files, the create phase made {}",
                    epoch.0,
                    servers_text(&self.args.servers),
                    files.len(),
                    state.metadata_files
                );
            }
            listed += files.len() as u64;
            if started.elapsed() >= self.deadline || files.is_empty() {
                break;
            }
        }
        Ok(Work { units: listed, seconds: started.elapsed().as_secs_f64() })
    }

    /// Untimed: one file in each of the first `metadata_files` remove epochs.
    fn prepare_remove(&self, state: &mut ThreadState) -> anyhow::Result<()> {
        let count = state.metadata_files as usize;
        for &epoch in &state.remove_epochs[..count] {
            state
                .client
                .create_file(epoch, "f")
                .with_context(|| format!("creating f in epoch {} (remove phase)", epoch.0))?;
        }
        Ok(())
    }

    fn remove(&self, state: &mut ThreadState) -> anyhow::Result<Work> {
        let count = state.metadata_files as usize;
        let started = Instant::now();
        let mut removed = 0u64;
        for &epoch in &state.remove_epochs[..count] {
            state
                .client
                .delete_epoch(epoch)
                .with_context(|| format!("deleting epoch {} (remove phase)", epoch.0))?;
            removed += 1;
            if removed.is_multiple_of(64) && started.elapsed() >= self.deadline {
                break;
            }
        }
        state.removed = removed;
        Ok(Work { units: removed, seconds: started.elapsed().as_secs_f64() })
    }
}

fn measure_level(
    args: &Args,
    epochs: &mut EpochAllocator,
    threads: usize,
) -> anyhow::Result<Level> {
    let mut states = Vec::with_capacity(threads);
    for thread in 0..threads {
        let client = connect(args, format!("spillway bench peaks thread {thread}"))?;
        states.push(ThreadState {
            client,
            data_epoch: epochs.allocate()?,
            iops_epoch: epochs.allocate()?,
            metadata_epoch: epochs.allocate()?,
            remove_epochs: epochs.allocate_many(args.metadata_files_per_thread)?,
            data: None,
            metadata_files: 0,
            removed: 0,
        });
    }
    let phases = Phases { args, deadline: Duration::from_secs_f64(args.phase_seconds) };
    let mut level = Level {
        threads,
        write_bytes_per_second: aggregate(&parallel(&mut states, |thread, state| {
            phases.write_bandwidth(thread, state)
        })?),
        read_bytes_per_second: aggregate(&parallel(&mut states, |thread, state| {
            phases.read_bandwidth(thread, state)
        })?),
        write_iops: aggregate(&parallel(&mut states, |thread, state| {
            phases.write_iops(thread, state)
        })?),
        read_iops: aggregate(&parallel(&mut states, |thread, state| {
            phases.read_iops(thread, state)
        })?),
        create_per_second: aggregate(&parallel(&mut states, |_, state| phases.create(state))?),
        stat_per_second: aggregate(&parallel(&mut states, |_, state| phases.stat(state))?),
        list_entries_per_second: aggregate(&parallel(&mut states, |_, state| phases.list(state))?),
        ..Level::default()
    };
    parallel(&mut states, |_, state| phases.prepare_remove(state).map(|()| Work::default()))?;
    level.remove_per_second = aggregate(&parallel(&mut states, |_, state| phases.remove(state))?);
    let namespaces = super::namespaces::measure(args, epochs, &mut states[0].client, threads)?;
    level.namespace_striped_ops_per_second = namespaces.rates.map(|(striped, _)| striped);
    level.namespace_private_ops_per_second = namespaces.rates.map(|(_, private)| private);
    // Untimed cleanup: the data, IOPS and metadata epochs, the remove epochs the phase's
    // time bound left, and the namespaces' epochs (which takes the namespaces with them).
    for epoch in namespaces.epochs {
        states[0]
            .client
            .delete_epoch(epoch)
            .with_context(|| format!("deleting benchmark namespace epoch {}", epoch.0))?;
    }
    for state in &mut states {
        let prepared = &state.remove_epochs[state.removed as usize..state.metadata_files as usize];
        let leftovers: Vec<EpochId> = [state.data_epoch, state.iops_epoch, state.metadata_epoch]
            .into_iter()
            .chain(prepared.iter().copied())
            .collect();
        for epoch in leftovers {
            state
                .client
                .delete_epoch(epoch)
                .with_context(|| format!("deleting benchmark epoch {}", epoch.0))?;
        }
    }
    epochs.outstanding.clear();
    Ok(level)
}
