//! File bytes: where a mounted file's data lives in the burst buffer store and how the mount
//! reads, writes, zero-fills and flushes it.
//!
//! Generation `g` of inode `i` of namespace `n` is the store file `ns/<n>/<i>.<g>`
//! ([`spillway_namespace::data_file_name`]) in the namespace's data epoch, placed by the client's
//! placement (striped over the reservation's servers by default), so it drains like any other
//! epoch data. The store never shrinks a file, so the mount keeps two rules (docs/design/mount.md,
//! "Truncate"):
//! - the namespace's size is the truth for EOF: reads are cut at it, bytes past it are never
//!   shown;
//! - a shrinking truncate overwrites whatever the store holds past the new size with zeros
//!   ([`Slot::zero_fill`]), bounded by the store's high-water mark for the file, so a gap left
//!   later by a write beyond EOF reads as zeros without that write touching it (writers on
//!   other mounts may have put their bytes there already).
//!
//! A [`spillway_client::Client`] needs `&mut self`, so the mount keeps a small pool of clients
//! ([`DataPlane`]), each run by a worker thread with its own connections and fed by a bounded
//! queue of commands; an inode always uses the same slot (`ino % slots`), which keeps one
//! file's writes and reads in order on one pipeline (a read sees every earlier write of the same
//! mount) while different files proceed in parallel. A write is queued (its bytes copied) and
//! the kernel answered at once, so the application's next `write(2)` overlaps the sending of
//! this one (write-behind, at most [`QUEUED_COMMANDS_MAX`] commands, i.e. that many MiB, per
//! slot); while several writes are in progress in the mount, a write instead goes to the
//! slot's client from the FUSE thread once the worker is idle ([`SlotGuard::write`]). A
//! failure is pinned on every inode the slot wrote since its last flush (a pipelined
//! failure does not say whose write it was) and reported to every flush (close) and fsync of
//! the inode until its last handle is released; the file system then withdraws the size those
//! writes claimed, so a file never shows zeros where the servers refused its bytes. Once the
//! servers refused a write for want of space, later writes are refused at once
//! ([`DataPlane::store_full`]) instead of each waiting out the servers' backpressure bound
//! again, until the next close or fsync tries again.
//! Each slot also has a lock that the file system holds across a truncate and the zero-fill
//! that follows it; it guards the slot's readahead windows ([`crate::readahead`]), which serve
//! a sequential reader's requests without a round trip. [`DataPlane::inline`] runs the same
//! slots without worker threads, each operation in the caller's thread under the slot's lock:
//! the preload library's data path.
//! There the slot's lock is the one lock (held for the [`SlotGuard`]'s life, as the worker
//! path's file-system lock is), writes go to the client from the caller's own buffer without
//! a copy, and reads fill the caller's buffer.

use std::collections::{HashMap, HashSet};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard};
use spillway_client::{placement, Client, ClientError, FileHandle};
use spillway_namespace::{data_file_name, Ino, NamespaceId};
use spillway_proto::ErrorCode;
use spillway_types::EpochId;

use crate::readahead::{Fetch, ReadAhead};

/// Store file handles kept per slot before the cache is cleared (bounds memory).
pub const HANDLES_CACHED_MAX: usize = 4096;
/// Commands queued per slot before a writer waits (each write is at most `max_write`, 1 MiB).
pub const QUEUED_COMMANDS_MAX: usize = 16;

/// A data operation that failed, naming the store file and the range.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("{operation} of store file {file} at offset {offset} ({length} bytes): {source}")]
    Client {
        operation: &'static str,
        file: String,
        offset: u64,
        length: u64,
        source: Box<ClientError>,
    },
    #[error("flushing writes to the store: {0}")]
    Flush(Box<ClientError>),
    #[error("the data worker of slot {slot} has stopped")]
    Stopped { slot: usize },
    #[error("asking the reservation's servers for their capacity: {0}")]
    Status(Box<ClientError>),
    /// The servers refused an earlier write for want of space: this one is refused without
    /// being sent (a close or fsync of any file tries the servers again).
    #[error("the reservation's servers are full: write refused at once after an earlier one was refused for want of space (close or fsync to try again)")]
    StoreFull,
    /// A write through the same data slot failed while this file had writes in flight; a
    /// pipelined failure does not say whose write it was, so this file's writes since its last
    /// flush may not be stored.
    #[error("a write through this file's data slot failed while the file had writes in flight, so they may not be stored: {message}")]
    SlotFailure { errno: i32, message: String },
    /// The data epoch this mount has used is on no server any more: the reservation was
    /// destroyed (or its data deleted) under the mount. Its files cannot be read, never as
    /// zeros.
    #[error("the mount's data epoch {epoch} is gone from every server (reservation destroyed or its data deleted): {file} cannot be read")]
    EpochVanished { epoch: EpochId, file: String },
}

impl DataError {
    /// The errno the application sees (the protocol's one table).
    pub fn errno(&self) -> i32 {
        let source = match self {
            DataError::Client { source, .. }
            | DataError::Flush(source)
            | DataError::Status(source) => &**source,
            DataError::Stopped { .. } | DataError::EpochVanished { .. } => return libc::EIO,
            DataError::StoreFull => return libc::ENOSPC,
            DataError::SlotFailure { errno, .. } => return *errno,
        };
        match source.code() {
            // A committed (sealed) data epoch cannot take more writes.
            Some(ErrorCode::EpochReadOnly) => libc::EROFS,
            _ => source.errno(),
        }
    }
}

/// The data path of one mount: a pool of clients, each driven by its worker thread.
pub struct DataPlane {
    slots: Vec<SlotChannel>,
    /// Writes in progress in the file system ([`DataPlane::writing`]): with more than one, a
    /// worker slot's writes are sent from the FUSE thread instead of queued (see
    /// [`SlotGuard::write`]).
    writers: AtomicUsize,
    /// See [`DataPlane::store_full`].
    store_full: Arc<AtomicBool>,
}

struct SlotChannel {
    /// Held by the file system across a size check and the data operation that depends on it
    /// (worker slots only: an inline slot's own lock serves, see [`SlotGuard`]); it guards the
    /// slot's readahead windows, so a read a window holds never waits for the worker.
    lock: Mutex<ReadAhead<Pending>>,
    runner: Option<Runner>,
    worker: Option<JoinHandle<()>>,
}

/// Where a slot's commands run: on its worker thread (the mount: a write is answered once
/// queued, so the next FUSE request overlaps its sending), or in the caller's thread under the
/// slot's lock (the preload library: the caller is the application itself, and the client
/// pipelines its sends anyway, so a thread hand-off per write would only cost; nor is a
/// command built: the caller's slices go to the client as they are).
enum Runner {
    Worker(Queue),
    Inline(Box<Mutex<Slot>>),
}

/// A worker slot's queue and the slot itself, which the worker locks for each command and a
/// FUSE thread may lock to write directly once the queue is empty.
struct Queue {
    sender: SyncSender<Command>,
    slot: Arc<Mutex<Slot>>,
    /// Commands sent and not yet run to the end (0: the worker is idle), and its signal.
    queued: Arc<Queued>,
}

#[derive(Default)]
struct Queued {
    /// `(commands not yet run, whether the worker has stopped)`.
    state: Mutex<(usize, bool)>,
    idle: Condvar,
}

impl Queued {
    fn add(&self) {
        self.state.lock().0 += 1;
    }

    fn done(&self) {
        let mut state = self.state.lock();
        // Saturating: `stopped` may have zeroed the count under a command that then failed.
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 {
            self.idle.notify_all();
        }
    }

    /// The worker is gone (its queue closed, or it panicked): nobody waits for it any more.
    fn stopped(&self) {
        *self.state.lock() = (0, true);
        self.idle.notify_all();
    }

    /// Waits until every command sent so far has run; false if the worker stopped.
    fn wait_idle(&self) -> bool {
        let mut state = self.state.lock();
        while state.0 > 0 {
            self.idle.wait(&mut state);
        }
        !state.1
    }
}

/// Marks the worker stopped when its loop ends, also by a panic (a writer waiting for the
/// queue to empty would wait forever otherwise).
struct StopsQueue<'a>(&'a Queued);

impl Drop for StopsQueue<'_> {
    fn drop(&mut self) {
        self.0.stopped();
    }
}

impl Queue {
    fn push(&self, command: Command) -> Result<(), Command> {
        self.queued.add();
        self.sender.send(command).map_err(|e| {
            self.queued.done();
            e.0
        })
    }
}

type Reply<T> = SyncSender<Result<T, DataError>>;

enum Command {
    Write {
        ino: Ino,
        generation: u64,
        offset: u64,
        data: Vec<u8>,
    },
    /// Fills `buffer` (of the length to read) and sends it back.
    Read {
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: Vec<u8>,
        reply: Reply<Vec<u8>>,
    },
    ZeroFill {
        ino: Ino,
        generation: u64,
        from: u64,
        to: u64,
        reply: Reply<()>,
    },
    /// `durable`: also make the acknowledged bytes durable in the servers' SSD logs (fsync).
    /// `ino`: the file being closed or fsync'd, whose writes a server restart lost are
    /// reported (EIO) now; `None`: the slot's own flush (unmount), no file's.
    /// `report`: a close or fsync, which reports the file's failure and tries full servers
    /// again; otherwise (the mount settling writes before it reports a size) it only says
    /// whether the file has a failure. Either way the failure stays pinned until the file's
    /// last handle is released ([`Command::Release`]).
    Flush {
        durable: bool,
        ino: Option<Ino>,
        report: bool,
        reply: Reply<()>,
    },
    Forget {
        ino: Ino,
    },
    StoreCapacity {
        reply: Reply<StoreCapacity>,
    },
    /// The inode's last handle is closed: forget its pinned failure.
    Release {
        ino: Ino,
    },
}

/// What the reservation's servers hold for files, over all of them: bytes of SSD log in all
/// and free, divided by the copies every byte takes (`replicas`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreCapacity {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

impl DataPlane {
    /// `clients` must all be connected to the same servers, in the same order, with the
    /// default striped placement (one per slot; at least one).
    pub fn new(clients: Vec<Client>, namespace: NamespaceId, epoch: EpochId) -> DataPlane {
        Self::with_slots(clients, namespace, epoch, |index, slot| {
            let (sender, receiver) = sync_channel(QUEUED_COMMANDS_MAX);
            let slot = Arc::new(Mutex::new(slot));
            let queued = Arc::new(Queued::default());
            let (served, counted) = (slot.clone(), queued.clone());
            let worker = std::thread::Builder::new()
                .name(format!("mount-data-{index}"))
                .spawn(move || serve(&served, &counted, receiver))
                .expect("spawning a data worker thread");
            (Runner::Worker(Queue { sender, slot, queued }), Some(worker))
        })
    }

    /// As [`DataPlane::new`], but each slot's commands run in the calling thread (no worker
    /// threads, no write-behind queue): for the preload library, whose callers are the
    /// application's own threads.
    pub fn inline(clients: Vec<Client>, namespace: NamespaceId, epoch: EpochId) -> DataPlane {
        Self::with_slots(clients, namespace, epoch, |_, slot| {
            (Runner::Inline(Box::new(Mutex::new(slot))), None)
        })
    }

    fn with_slots(
        clients: Vec<Client>,
        namespace: NamespaceId,
        epoch: EpochId,
        run: impl Fn(usize, Slot) -> (Runner, Option<JoinHandle<()>>),
    ) -> DataPlane {
        assert!(!clients.is_empty(), "a data plane needs at least one client");
        let epoch_seen = Arc::new(AtomicBool::new(false));
        let store_full = Arc::new(AtomicBool::new(false));
        let slots = clients
            .into_iter()
            .enumerate()
            .map(|(index, mut client)| {
                client.begin_epoch(epoch);
                let slot = Slot {
                    client,
                    namespace,
                    epoch,
                    handles: HashMap::new(),
                    dirty: HashSet::new(),
                    failed: HashMap::new(),
                    readahead: ReadAhead::default(),
                    epoch_seen: epoch_seen.clone(),
                    store_full: store_full.clone(),
                };
                let (runner, worker) = run(index, slot);
                SlotChannel { lock: Mutex::new(ReadAhead::default()), runner: Some(runner), worker }
            })
            .collect();
        DataPlane { slots, writers: AtomicUsize::new(0), store_full }
    }

    /// Counts a write of the file system in progress until the guard is dropped (taken before
    /// the slot, so writers waiting for a slot's lock count too).
    pub fn writing(&self) -> Writing<'_> {
        self.writers.fetch_add(1, Ordering::Relaxed);
        Writing(&self.writers)
    }

    /// The servers refused a write for want of space since the last close or fsync: writes are
    /// refused at once (ENOSPC at `write(2)`), so a full burst buffer costs one backpressure
    /// wait (`server.backpressure_wait_ms_max`), not one per batch of writes.
    pub fn store_full(&self) -> bool {
        self.store_full.load(Ordering::Relaxed)
    }

    /// The slot serving inode `ino`, locked.
    pub fn slot(&self, ino: Ino) -> SlotGuard<'_> {
        let index = (ino % self.slots.len() as u64) as usize;
        self.slot_at(index, Some(ino))
    }

    fn slot_at(&self, index: usize, ino: Option<Ino>) -> SlotGuard<'_> {
        let channel = &self.slots[index];
        let held = match channel.runner.as_ref().expect("open until drop") {
            Runner::Worker(queue) => Held::Worker { readahead: channel.lock.lock(), queue },
            // The slot's own lock orders its operations as the file-system lock orders a
            // worker's queue: one lock per operation, not two.
            Runner::Inline(slot) => Held::Inline(slot.lock()),
        };
        SlotGuard { held, index, ino, writers: &self.writers }
    }

    /// The capacity of every server of the reservation (`statfs` of the mount), asked through
    /// the first slot.
    pub fn store_capacity(&self) -> Result<StoreCapacity, DataError> {
        self.slot_at(0, None)
            .call(|slot| slot.store_capacity(), |reply| Command::StoreCapacity { reply })
    }

    /// Flushes every slot's pipeline; the first failure.
    pub fn flush_all(&self) -> Result<(), DataError> {
        let mut first = None;
        for index in 0..self.slots.len() {
            if let Err(e) = self.slot_at(index, None).flush() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        for channel in &mut self.slots {
            // A worker flushes when its queue closes; an inline slot is flushed here.
            if let Some(Runner::Inline(slot)) = channel.runner.take() {
                if let Err(e) = slot.into_inner().flush() {
                    tracing::error!(error = %e, "flushing writes at the end failed");
                }
            }
            if let Some(worker) = channel.worker.take() {
                let _ = worker.join();
            }
        }
    }
}

/// A write in progress ([`DataPlane::writing`]).
pub struct Writing<'a>(&'a AtomicUsize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A locked slot: the data operations of one inode.
pub struct SlotGuard<'a> {
    held: Held<'a>,
    index: usize,
    writers: &'a AtomicUsize,
    /// The inode the slot was taken for (its losses are reported by flush and sync).
    ino: Option<Ino>,
}

/// What a [`SlotGuard`] holds.
enum Held<'a> {
    /// A worker slot: the file system's lock on it (its readahead windows), and its queue.
    Worker { readahead: MutexGuard<'a, ReadAhead<Pending>>, queue: &'a Queue },
    /// An inline slot itself, locked: operations run on it in the caller's thread.
    Inline(MutexGuard<'a, Slot>),
}

impl SlotGuard<'_> {
    /// Drops a worker slot's readahead windows of `ino` (written, zero-filled, opened or
    /// released); an inline slot drops its own when it runs the operation.
    fn invalidate(&mut self, ino: Ino) {
        if let Held::Worker { readahead, .. } = &mut self.held {
            readahead.invalidate(ino);
        }
    }

    fn send(&mut self, command: Command) -> Result<(), DataError> {
        match &mut self.held {
            Held::Worker { queue, .. } => {
                queue.push(command).map_err(|_| DataError::Stopped { slot: self.index })
            }
            Held::Inline(slot) => {
                slot.execute(command);
                Ok(())
            }
        }
    }

    /// Runs `inline` on an inline slot, or sends the command `make` builds to the worker and
    /// waits for its answer.
    fn call<T>(
        &mut self,
        inline: impl FnOnce(&mut Slot) -> Result<T, DataError>,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, DataError> {
        match &mut self.held {
            Held::Inline(slot) => inline(slot),
            Held::Worker { .. } => self.ask(make),
        }
    }

    /// Sends the command `make` builds to the worker and waits for its answer.
    fn ask<T>(&mut self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, DataError> {
        let (reply, answer) = sync_channel(1);
        self.send(make(reply))?;
        answer.recv().map_err(|_| DataError::Stopped { slot: self.index })?
    }

    /// Queues a write of `data` at `offset` (copied into the worker's queue; an inline slot,
    /// or a worker slot while the file system has several writes in progress, hands the slice
    /// to its client, which sends or gathers it before this returns). The write fails, if at
    /// all, by the next flush of the slot.
    pub fn write(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DataError> {
        match &mut self.held {
            Held::Inline(slot) => {
                slot.queued_write(ino, generation, offset, data);
                Ok(())
            }
            Held::Worker { readahead, queue } => {
                readahead.invalidate(ino);
                if self.writers.load(Ordering::Relaxed) > 1 {
                    // Several writes at once: the CPU, not one writer's latency, is the limit,
                    // so the bytes go to the client from the FUSE request without a copy or a
                    // hand-off, once the worker ran what was queued before (only this lock's
                    // holder queues, so the order of the slot's operations is kept).
                    if !queue.queued.wait_idle() {
                        return Err(DataError::Stopped { slot: self.index });
                    }
                    queue.slot.lock().queued_write(ino, generation, offset, data);
                    return Ok(());
                }
                self.send(Command::Write { ino, generation, offset, data: data.to_vec() })
            }
        }
    }

    /// Fills `buffer` from `offset`, after every write queued before; unwritten bytes are zeros.
    /// `size` is the file's size, past which readahead never reads.
    pub fn read(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<(), DataError> {
        let index = self.index;
        match &mut self.held {
            Held::Inline(slot) => slot.read_ahead(ino, generation, offset, buffer, size),
            Held::Worker { readahead, queue } => {
                let mut fetch = WorkerFetch { queue, slot: index, ino, generation };
                readahead.read_through(&mut fetch, ino, generation, offset, buffer, size)
            }
        }
    }

    /// [`Self::read`] of `length` bytes handed to `deliver` (the FUSE reply), straight from a
    /// readahead window where one serves them: no buffer to fill and copy again.
    pub fn read_with<R>(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        length: usize,
        size: u64,
        deliver: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, DataError> {
        let index = self.index;
        match &mut self.held {
            Held::Inline(slot) => {
                let mut buffer = vec![0u8; length];
                slot.read_ahead(ino, generation, offset, &mut buffer, size)?;
                Ok(deliver(&buffer))
            }
            Held::Worker { readahead, queue } => {
                let mut fetch = WorkerFetch { queue, slot: index, ino, generation };
                if let Some(bytes) =
                    readahead.serve(&mut fetch, ino, generation, offset, length, size)?
                {
                    return Ok(deliver(bytes));
                }
                let bytes = fetch.read(offset, vec![0u8; length])?;
                Ok(deliver(&bytes))
            }
        }
    }

    /// See [`Slot::zero_fill`].
    pub fn zero_fill(
        &mut self,
        ino: Ino,
        generation: u64,
        from: u64,
        to: u64,
    ) -> Result<(), DataError> {
        self.invalidate(ino);
        self.call(
            |slot| slot.zero_fill(ino, generation, from, to),
            |reply| Command::ZeroFill { ino, generation, from, to, reply },
        )
    }

    /// Waits until every write queued so far is acknowledged by its server; the failure of
    /// this slot's inode, if any: what `close` reports. FUSE sends a flush for every close of a
    /// descriptor, also the ones a forked child closes at exec, so the failure is reported to
    /// every close and fsync until the last handle is released, never to just the first.
    pub fn flush(&mut self) -> Result<(), DataError> {
        let ino = self.ino;
        self.call(
            |slot| slot.flush_for(false, ino, true),
            |reply| Command::Flush { durable: false, ino, report: true, reply },
        )
    }

    /// [`Self::flush`] without trying full servers again: Err when the inode has a failure
    /// pinned (a `stat` settles writes before the size is reported, and withdraws it).
    pub fn settle(&mut self) -> Result<(), DataError> {
        let ino = self.ino;
        self.call(
            |slot| slot.flush_for(false, ino, false),
            |reply| Command::Flush { durable: false, ino, report: false, reply },
        )
    }

    /// [`Self::flush`], then every server this slot wrote to syncs its SSD log: what `fsync`
    /// promises (the data survives a server crash).
    pub fn sync(&mut self) -> Result<(), DataError> {
        let ino = self.ino;
        self.call(
            |slot| slot.flush_for(true, ino, true),
            |reply| Command::Flush { durable: true, ino, report: true, reply },
        )
    }

    /// Forgets cached store handles of `ino` (at open: close-to-open means asking again).
    pub fn forget(&mut self, ino: Ino) {
        self.invalidate(ino);
        // A stopped worker has nothing cached.
        let _ = self.send(Command::Forget { ino });
    }

    /// The last handle of `ino` is closed: its failure, reported to every close and fsync so
    /// far, is forgotten (a new open starts clean).
    pub fn release(&mut self, ino: Ino) {
        self.invalidate(ino);
        // A stopped worker has nothing pinned.
        let _ = self.send(Command::Release { ino });
    }
}

/// The worker loop: runs commands in order, each under the slot's lock, until the plane is
/// dropped; then flushes.
fn serve(slot: &Mutex<Slot>, queued: &Queued, commands: Receiver<Command>) {
    let _stops = StopsQueue(queued);
    for command in commands {
        slot.lock().execute(command);
        queued.done();
    }
    if let Err(e) = slot.lock().flush() {
        tracing::error!(error = %e, "flushing writes at unmount failed");
    }
}

/// A worker slot's background read: the worker's answer.
type Pending = Receiver<Result<Vec<u8>, DataError>>;

/// Reads of one inode through a worker slot's queue.
struct WorkerFetch<'a> {
    queue: &'a Queue,
    slot: usize,
    ino: Ino,
    generation: u64,
}

impl Fetch for WorkerFetch<'_> {
    type Pending = Pending;
    type Error = DataError;

    fn read(&mut self, offset: u64, bytes: Vec<u8>) -> Result<Vec<u8>, DataError> {
        let pending = self.send(offset, bytes)?;
        self.finish(pending)
    }

    fn read_into(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), DataError> {
        let bytes = self.read(offset, vec![0u8; buffer.len()])?;
        buffer.copy_from_slice(&bytes);
        Ok(())
    }

    fn start(&mut self, offset: u64, bytes: Vec<u8>) -> Option<Pending> {
        self.send(offset, bytes).ok()
    }

    fn finish(&mut self, pending: Pending) -> Result<Vec<u8>, DataError> {
        pending.recv().map_err(|_| DataError::Stopped { slot: self.slot })?
    }
}

impl WorkerFetch<'_> {
    fn send(&self, offset: u64, buffer: Vec<u8>) -> Result<Pending, DataError> {
        let (reply, answer) = sync_channel(1);
        let (ino, generation) = (self.ino, self.generation);
        self.queue
            .push(Command::Read { ino, generation, offset, buffer, reply })
            .map_err(|_| DataError::Stopped { slot: self.slot })?;
        Ok(answer)
    }
}

/// Reads of one inode in an inline slot, in the caller's thread.
struct InlineFetch<'a> {
    slot: &'a mut Slot,
    ino: Ino,
    generation: u64,
}

impl Fetch for InlineFetch<'_> {
    type Pending = ();
    type Error = DataError;

    fn read(&mut self, offset: u64, mut bytes: Vec<u8>) -> Result<Vec<u8>, DataError> {
        self.read_into(offset, &mut bytes)?;
        Ok(bytes)
    }

    fn read_into(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), DataError> {
        self.slot.read(self.ino, self.generation, offset, buffer)
    }

    fn start(&mut self, _offset: u64, _bytes: Vec<u8>) -> Option<()> {
        None
    }

    fn finish(&mut self, (): ()) -> Result<Vec<u8>, DataError> {
        unreachable!("an inline slot starts no background read")
    }
}

/// One client of the pool and the store file handles it has resolved.
pub struct Slot {
    client: Client,
    namespace: NamespaceId,
    epoch: EpochId,
    /// (ino, generation) → handle covering every server of the file's stripe set.
    handles: HashMap<(Ino, u64), FileHandle>,
    /// Inodes written through this slot since its last flush: a failure found meanwhile may
    /// be any of theirs. Bounded by the open files the slot serves.
    dirty: HashSet<Ino>,
    /// Inodes some of whose writes may not be stored, and why; reported to every close and
    /// fsync of the inode, forgotten when its last handle is released.
    failed: HashMap<Ino, DataError>,
    /// Sequential readers' next bytes, read ahead (dropped for an inode this slot writes).
    /// Inline slots only (a worker slot's are under its file-system lock).
    readahead: ReadAhead<()>,
    /// Some server held the data epoch since the mount started (shared by every slot): from
    /// then on an epoch on no server has vanished, and its files read as EIO, not zeros.
    epoch_seen: Arc<AtomicBool>,
    /// Shared by every slot: [`DataPlane::store_full`].
    store_full: Arc<AtomicBool>,
}

impl Slot {
    /// Runs one command (answering on its reply channel, if it has one).
    fn execute(&mut self, command: Command) {
        match command {
            Command::Write { ino, generation, offset, data } => {
                self.queued_write(ino, generation, offset, &data);
            }
            Command::Read { ino, generation, offset, mut buffer, reply } => {
                let read = self.read(ino, generation, offset, &mut buffer);
                let _ = reply.send(read.map(|()| buffer));
            }
            Command::ZeroFill { ino, generation, from, to, reply } => {
                let _ = reply.send(self.zero_fill(ino, generation, from, to));
            }
            Command::Flush { durable, ino, report, reply } => {
                let _ = reply.send(self.flush_for(durable, ino, report));
            }
            Command::Forget { ino } => self.forget(ino),
            Command::StoreCapacity { reply } => {
                let _ = reply.send(self.store_capacity());
            }
            Command::Release { ino } => {
                self.failed.remove(&ino);
                self.readahead.invalidate(ino);
            }
        }
    }

    /// A write the caller was told is queued: a failure is pinned on the files written since
    /// the last flush, for their close or fsync to report.
    fn queued_write(&mut self, ino: Ino, generation: u64, offset: u64, data: &[u8]) {
        self.dirty.insert(ino);
        if self.store_full.load(Ordering::Relaxed) {
            // Queued before the refusal was known: sending it would only wait
            // out the servers' backpressure bound again.
            self.fail_dirty(DataError::StoreFull);
        } else if let Err(e) = self.write(ino, generation, offset, data) {
            tracing::warn!(error = %e, "queued write failed");
            self.fail_dirty(e);
        }
    }

    /// Flushes (`durable`: syncs) the slot and reports what failed for `ino` (for `None`, the
    /// unmount's flush, for any inode); with `report` false only says whether something did.
    /// A close or fsync is where the servers are tried again after they were full.
    fn flush_for(
        &mut self,
        durable: bool,
        ino: Option<Ino>,
        report: bool,
    ) -> Result<(), DataError> {
        let flushed = if durable { self.sync(ino) } else { self.flush() };
        // An fsync whose sync failed cannot call the file durable, even when no write of it
        // was in flight to pin the failure on (the broken connection of a restarted server).
        let mut sync_failed = None;
        match flushed {
            Ok(()) => self.dirty.clear(),
            Err(e) if durable && ino.is_some() => {
                let errno = e.errno();
                self.fail_dirty(DataError::SlotFailure { errno, message: e.to_string() });
                sync_failed = Some(e);
            }
            Err(e) => self.fail_dirty(e),
        }
        if report {
            // A close or fsync is where writes try the servers again.
            self.store_full.store(false, Ordering::Relaxed);
        }
        let failure = match ino {
            Some(ino) => self.failed.get(&ino),
            None => self.failed.values().next(),
        };
        if let Some(e) = failure {
            return Err(DataError::SlotFailure { errno: e.errno(), message: e.to_string() });
        }
        if !report {
            return Ok(());
        }
        // Lost writes are reported (and so marked reported) either way.
        let lost = self.report_lost(ino);
        match sync_failed {
            Some(e) => Err(e),
            None => lost,
        }
    }

    /// Pins `error` on every inode written since the last flush (the first keeps the error
    /// itself, the others its errno and message) and, for want of space, refuses later writes.
    fn fail_dirty(&mut self, error: DataError) {
        let errno = error.errno();
        if errno == libc::ENOSPC || errno == libc::EDQUOT {
            self.store_full.store(true, Ordering::Relaxed);
        }
        let message = error.to_string();
        let mut first = Some(error);
        for ino in self.dirty.drain() {
            let error = first
                .take()
                .unwrap_or_else(|| DataError::SlotFailure { errno, message: message.clone() });
            self.failed.entry(ino).or_insert(error);
        }
        if first.is_some() {
            tracing::warn!(%message, "a data failure with no file written since the last flush");
        }
    }

    fn store_capacity(&mut self) -> Result<StoreCapacity, DataError> {
        let statuses = self.client.status().map_err(|e| DataError::Status(Box::new(e)))?;
        let copies = u64::from(self.client.replicas().max(1));
        let total: u64 = statuses.iter().map(|s| s.ssd_bytes_max).sum();
        let free: u64 =
            statuses.iter().map(|s| s.ssd_bytes_max.saturating_sub(s.ssd_bytes_used)).sum();
        Ok(StoreCapacity { total_bytes: total / copies, free_bytes: free / copies })
    }

    fn name(&self, ino: Ino, generation: u64) -> String {
        data_file_name(self.namespace, ino, generation)
    }

    fn remember(&mut self, ino: Ino, generation: u64, handle: FileHandle) {
        if self.handles.len() >= HANDLES_CACHED_MAX {
            self.handles.clear();
        }
        self.handles.insert((ino, generation), handle);
    }

    /// Forgets cached handles of `ino` (at open: close-to-open means asking the servers again).
    pub fn forget(&mut self, ino: Ino) {
        self.handles.retain(|(i, _), _| *i != ino);
        self.readahead.invalidate(ino);
    }

    /// Makes sure a handle to write through is cached: the file is created on every server of
    /// its stripe set.
    fn writable(&mut self, ino: Ino, generation: u64) -> Result<(), DataError> {
        if self.handles.contains_key(&(ino, generation)) {
            return Ok(());
        }
        let name = self.name(ino, generation);
        let handle =
            self.client.create_file(self.epoch, &name).map_err(|source| DataError::Client {
                operation: "create",
                file: name.clone(),
                offset: 0,
                length: 0,
                source: Box::new(source),
            })?;
        self.epoch_seen.store(true, Ordering::Relaxed);
        self.remember(ino, generation, handle);
        Ok(())
    }

    /// A handle to read through, or `None` if no server holds the file (never written).
    fn readable(&mut self, ino: Ino, generation: u64) -> Result<Option<FileHandle>, DataError> {
        if let Some(handle) = self.handles.get(&(ino, generation)) {
            return Ok(Some(handle.clone()));
        }
        let name = self.name(ino, generation);
        match self.client.open_file(self.epoch, &name) {
            Ok(handle) => {
                self.epoch_seen.store(true, Ordering::Relaxed);
                // Cache only a handle that covers the whole stripe set: another mount may still
                // create the file on the missing servers.
                let servers = self.client.server_count();
                let stripe = placement::stripe_set(
                    spillway_client::Placement::striped_default(),
                    &name,
                    servers,
                );
                if stripe.iter().all(|s| handle.servers().contains(s)) {
                    self.remember(ino, generation, handle.clone());
                }
                Ok(Some(handle))
            }
            Err(ClientError::NoSuchFile { .. }) => {
                self.epoch_seen.store(true, Ordering::Relaxed);
                Ok(None)
            }
            // Before any server held the epoch nothing was written: holes. After, it vanished.
            Err(ClientError::NoSuchEpoch { .. }) if self.epoch_seen.load(Ordering::Relaxed) => {
                Err(DataError::EpochVanished { epoch: self.epoch, file: name })
            }
            Err(ClientError::NoSuchEpoch { .. }) => Ok(None),
            Err(e) if matches!(e.code(), Some(ErrorCode::NoSuchFile | ErrorCode::NoSuchEpoch)) => {
                Ok(None)
            }
            Err(source) => Err(DataError::Client {
                operation: "open",
                file: name,
                offset: 0,
                length: 0,
                source: Box::new(source),
            }),
        }
    }

    /// Writes `data` at `offset` (pipelined: failures surface by the next flush of this slot).
    pub fn write(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DataError> {
        self.writable(ino, generation)?;
        self.readahead.invalidate(ino);
        // The cached handle itself, not a copy per write (a server the client creates the
        // file on meanwhile stays known).
        let handle = self.handles.get_mut(&(ino, generation)).expect("cached by writable");
        self.client.write(handle, offset, data).map_err(|source| DataError::Client {
            operation: "write",
            file: handle.name.clone(),
            offset,
            length: data.len() as u64,
            source: Box::new(source),
        })
    }

    /// [`Slot::read`] through the slot's readahead windows (crate::readahead), for an inline
    /// slot, which fetches no window in the background.
    pub fn read_ahead(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<(), DataError> {
        let mut readahead = std::mem::take(&mut self.readahead);
        let read = readahead.read_through(
            &mut InlineFetch { slot: self, ino, generation },
            ino,
            generation,
            offset,
            buffer,
            size,
        );
        self.readahead = readahead;
        read
    }

    /// Fills `buffer` from `offset`; bytes the store does not hold read as zeros.
    pub fn read(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), DataError> {
        let key = (ino, generation);
        // The cached handle itself when there is one, not a copy per read.
        let opened = if self.handles.contains_key(&key) {
            None
        } else {
            let Some(handle) = self.readable(ino, generation)? else {
                buffer.fill(0);
                return Ok(());
            };
            Some(handle)
        };
        let handle = match &opened {
            Some(handle) => handle,
            None => &self.handles[&key],
        };
        self.client.read(handle, offset, buffer).map_err(|source| DataError::Client {
            operation: "read",
            file: handle.name.clone(),
            offset,
            length: buffer.len() as u64,
            source: Box::new(source),
        })
    }

    /// Overwrites with zeros whatever the store holds of `[from, to)` (stale bytes left by a
    /// shrinking truncate, a punched hole), up to the store's high-water mark for the file:
    /// runs of zeros, one small record per stripe unit, not the bytes. Costs one stat per
    /// server holding the file when there is nothing to do.
    pub fn zero_fill(
        &mut self,
        ino: Ino,
        generation: u64,
        from: u64,
        to: u64,
    ) -> Result<(), DataError> {
        if from >= to {
            return Ok(());
        }
        let Some(handle) = self.readable(ino, generation)? else { return Ok(()) };
        let name = handle.name.clone();
        let high_water = self.client.file_size(&handle).map_err(|source| DataError::Client {
            operation: "stat",
            file: name.clone(),
            offset: 0,
            length: 0,
            source: Box::new(source),
        })?;
        let end = to.min(high_water);
        if from >= end {
            return Ok(());
        }
        self.writable(ino, generation)?;
        self.readahead.invalidate(ino);
        let handle = self.handles.get_mut(&(ino, generation)).expect("cached by writable");
        // One small record per stripe unit on each server, whatever the range's length.
        self.client.write_zeros(handle, from, end - from).map_err(|source| DataError::Client {
            operation: "zero-fill",
            file: name,
            offset: from,
            length: end - from,
            source: Box::new(source),
        })
    }

    /// Waits until every write sent through this slot is acknowledged by its server.
    pub fn flush(&mut self) -> Result<(), DataError> {
        self.client.flush().map_err(|e| DataError::Flush(Box::new(e)))
    }

    /// Flushes, then syncs the data epoch on the servers holding writes of `ino` (any
    /// generation) that no sync covered yet, none if there are none; for `None` (no file: the
    /// unmount's), on every server this slot's client wrote it to.
    pub fn sync(&mut self, ino: Option<Ino>) -> Result<(), DataError> {
        let synced = match ino {
            Some(ino) => self.client.sync_files(self.epoch, &self.file_prefix(ino)),
            None => self.client.sync_epoch(self.epoch),
        };
        synced.map_err(|e| DataError::Flush(Box::new(e)))
    }

    /// What the store names of every generation of `ino` start with.
    fn file_prefix(&self, ino: Ino) -> String {
        let prefix = format!("ns/{}/{ino}.", self.namespace);
        debug_assert!(data_file_name(self.namespace, ino, 0).starts_with(&prefix));
        prefix
    }

    /// Fails (EIO, naming the server), once, if a server restart lost writes this slot made
    /// to `ino` (any generation) that were not fsync'd: the close or fsync of the file says so.
    fn report_lost(&mut self, ino: Option<Ino>) -> Result<(), DataError> {
        let Some(ino) = ino else { return Ok(()) };
        let prefix = self.file_prefix(ino);
        self.client
            .report_lost_writes(self.epoch, &prefix)
            .map_err(|e| DataError::Flush(Box::new(e)))
    }
}
