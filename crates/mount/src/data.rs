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
//! queue of commands. A file's bytes are cut into stripes of [`SLOT_STRIPE_BYTES`], and each
//! stripe always uses the same slot ([`Route::slot`]): its writes, zero-fills and reads stay in
//! order on one pipeline (a read sees every earlier write of the same mount), and the client
//! that wrote a stripe is the one that reads it back, so writes a server restart lost there fail
//! the read instead of reading as zeros (only that client knows of them). One file's stripes
//! spread over the slots, so several writers or readers of one file, and one writer's
//! write-behind, use several clients at once. Per file, a shared lock ([`DataPlane::file`])
//! is held by reads and writes and an exclusive one ([`DataPlane::exclusive`]) by a truncate or
//! a punched hole, which settle and zero every slot. A write is queued (its bytes copied) and
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
//! Each slot also has a lock, held while an operation is queued on it; it guards the slot's
//! readahead windows ([`crate::readahead`]) of the stripes it serves, which serve a sequential
//! reader's requests without a round trip (a window never reaches past its stripe; the next
//! stripe's is fetched on its own slot). [`DataPlane::inline`] runs the same slots without
//! worker threads, each operation in the caller's thread under the slot's lock, and a file is
//! one slot's (`ino % slots`): the preload library's data path.
//! There the slot's lock is the one lock (held for the [`SlotGuard`]'s life, as the worker
//! path's file-system lock is), writes go to the client from the caller's own buffer without
//! a copy, and reads fill the caller's buffer.

use std::collections::{HashMap, HashSet};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use spillway_client::{placement, Client, ClientError, FileHandle};
use spillway_namespace::{data_file_name, Ino, NamespaceId};
use spillway_proto::ErrorCode;
use spillway_types::EpochId;

use crate::readahead::{Fetch, ReadAhead};

/// Store file handles kept per slot before the cache is cleared (bounds memory).
pub const HANDLES_CACHED_MAX: usize = 4096;
/// Commands queued per slot before a writer waits (each write is at most `max_write`, 1 MiB).
pub const QUEUED_COMMANDS_MAX: usize = 16;
/// Bytes of a file one worker slot serves in a row: stripe `k` of inode `i` is one slot's
/// ([`Route::slot`]) for its writes, zero-fills and reads alike, so one file's I/O spreads over
/// the slots while each byte keeps one pipeline. The client's stripe unit, so a slot's stripe
/// lies on one server.
pub const SLOT_STRIPE_BYTES: u64 = 1 << 20;
/// Stripes past the one a sequential reader is in that are fetched ahead, each by its own slot
/// (two: a fetch skipped because its slot was busy gets a second chance a stripe earlier).
const STRIPES_PREFETCHED: usize = 2;
/// Shards of the per-file locks ([`DataPlane::file`], [`DataPlane::exclusive`]): inode `i`
/// uses shard `i % FILE_LOCK_SHARDS`.
const FILE_LOCK_SHARDS: usize = 64;

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
    /// A write through a data slot failed while this file had writes in flight there; a
    /// pipelined failure does not say whose write it was, so this file's writes since its last
    /// flush may not be stored.
    #[error("a write through one of this file's data slots failed while the file had writes in flight there, so they may not be stored: {message}")]
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
    route: Route,
    /// Per shard of inodes: reads and writes of a file share it, a truncate or hole punch of
    /// it holds it alone, so no write of this mount lands between the size it reads and the
    /// zeros it sends.
    files: Vec<RwLock<()>>,
    /// See [`RangesInFlight`].
    ranges: RangesInFlight,
    /// Writes in progress in the file system ([`DataPlane::writing`]): with more than one, a
    /// worker slot's writes are sent from the FUSE thread instead of queued (see
    /// [`SlotGuard::write`]).
    writers: AtomicUsize,
    /// See [`DataPlane::store_full`].
    store_full: Arc<AtomicBool>,
}

/// Byte ranges of files being written, or read across slots. The kernel lets direct writes of
/// one file run in parallel (`FOPEN_PARALLEL_DIRECT_WRITES`), and a write cut over several slots
/// is queued piece by piece, so overlapping ranges wait for each other here: each such write
/// lands whole before or after an overlapping one, and a read across slots sees all of a write
/// or none of it, as when one slot served the file. At most one entry per request in progress.
#[derive(Default)]
struct RangesInFlight {
    ranges: Mutex<Vec<(Ino, u64, u64)>>,
    freed: Condvar,
}

impl RangesInFlight {
    /// Waits until no range of `ino` in flight overlaps `[start, end)`, then holds it.
    fn hold(&self, ino: Ino, start: u64, end: u64) -> RangeHeld<'_> {
        let mut ranges = self.ranges.lock();
        while ranges.iter().any(|&(i, s, e)| i == ino && s < end && start < e) {
            self.freed.wait(&mut ranges);
        }
        ranges.push((ino, start, end));
        RangeHeld { ranges: self, entry: (ino, start, end) }
    }
}

/// A range held in [`RangesInFlight`] until dropped.
struct RangeHeld<'a> {
    ranges: &'a RangesInFlight,
    entry: (Ino, u64, u64),
}

impl Drop for RangeHeld<'_> {
    fn drop(&mut self) {
        let mut ranges = self.ranges.ranges.lock();
        let index = ranges.iter().position(|r| *r == self.entry).expect("held until dropped");
        ranges.swap_remove(index);
        self.ranges.freed.notify_all();
    }
}

/// Which slot serves which bytes of a file.
#[derive(Clone, Copy, Debug)]
struct Route {
    slots: usize,
    /// Worker slots (more than one): a file's stripes spread over the slots. Inline slots (the
    /// preload library, whose callers are the application's threads): a file is one slot's.
    spread: bool,
}

impl Route {
    /// The slot serving the byte at `offset` of inode `ino`. Each run of `slots` consecutive
    /// stripes goes to every slot once, in an order drawn from the inode and the run, so a
    /// lone sequential writer keeps every slot busy and writers a block apart (IOR's shared
    /// file) do not line up on one slot.
    fn slot(&self, ino: Ino, offset: u64) -> usize {
        let slots = self.slots as u64;
        if !self.spread {
            return (ino % slots) as usize;
        }
        let stripe = offset / SLOT_STRIPE_BYTES;
        (stripe.wrapping_add(mix(ino, stripe / slots)) % slots) as usize
    }

    /// Where the run of bytes from `offset` that one slot serves ends.
    fn piece_end(&self, offset: u64) -> u64 {
        if self.spread {
            (offset / SLOT_STRIPE_BYTES + 1).saturating_mul(SLOT_STRIPE_BYTES)
        } else {
            u64::MAX
        }
    }

    /// `[offset, offset + length)` cut where the serving slot changes: `(slot, offset,
    /// length)` pieces, in order.
    fn pieces(
        &self,
        ino: Ino,
        offset: u64,
        length: u64,
    ) -> impl Iterator<Item = (usize, u64, u64)> {
        let route = *self;
        let end = offset.saturating_add(length);
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let piece_end = route.piece_end(at).min(end);
            let piece = (route.slot(ino, at), at, piece_end - at);
            at = piece_end;
            Some(piece)
        })
    }

    /// Whether the slot `index` serves the bytes of stripe-run `[offset, …)`.
    fn serves(&self, index: usize, ino: Ino, offset: u64) -> bool {
        self.slot(ino, offset) == index
    }
}

/// splitmix64's finaliser over an inode and a run of stripes.
fn mix(ino: Ino, run: u64) -> u64 {
    let mut x = ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ run.wrapping_add(0x632B_E59B_D9B4_E019);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

struct SlotChannel {
    /// Held while an operation is queued on the slot or a FUSE thread writes through its
    /// client (worker slots only: an inline slot's own lock serves, see [`SlotGuard`]); it
    /// guards the slot's readahead windows, so a read a window holds never waits for the
    /// worker.
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
        Self::with_slots(clients, namespace, epoch, true, |index, slot| {
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
        Self::with_slots(clients, namespace, epoch, false, |_, slot| {
            (Runner::Inline(Box::new(Mutex::new(slot))), None)
        })
    }

    fn with_slots(
        clients: Vec<Client>,
        namespace: NamespaceId,
        epoch: EpochId,
        workers: bool,
        run: impl Fn(usize, Slot) -> (Runner, Option<JoinHandle<()>>),
    ) -> DataPlane {
        assert!(!clients.is_empty(), "a data plane needs at least one client");
        let route = Route { slots: clients.len(), spread: workers && clients.len() > 1 };
        let epoch_seen = Arc::new(AtomicBool::new(false));
        let store_full = Arc::new(AtomicBool::new(false));
        let slots = clients
            .into_iter()
            .enumerate()
            .map(|(index, mut client)| {
                client.begin_epoch(epoch);
                let slot = Slot {
                    client,
                    index,
                    route,
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
        let files = (0..FILE_LOCK_SHARDS).map(|_| RwLock::new(())).collect();
        DataPlane {
            slots,
            route,
            files,
            ranges: RangesInFlight::default(),
            writers: AtomicUsize::new(0),
            store_full,
        }
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

    /// Reads and writes of `ino`, alongside every other reader and writer of it.
    pub fn file(&self, ino: Ino) -> FileAccess<'_> {
        FileAccess { plane: self, ino, _shared: self.files[Self::shard(ino)].read() }
    }

    /// `ino` held alone: no read or write of it through this mount runs meanwhile (a truncate
    /// across its size change and zero-fill, a punched hole).
    pub fn exclusive(&self, ino: Ino) -> FileExclusive<'_> {
        FileExclusive { plane: self, ino, _alone: self.files[Self::shard(ino)].write() }
    }

    fn shard(ino: Ino) -> usize {
        (ino % FILE_LOCK_SHARDS as u64) as usize
    }

    /// Waits until every write of `ino` queued so far is acknowledged by its server; the
    /// failure of the file, if any: what `close` reports. FUSE sends a flush for every close of
    /// a descriptor, also the ones a forked child closes at exec, so the failure is reported to
    /// every close and fsync until the last handle is released, never to just the first.
    pub fn flush(&self, ino: Ino) -> Result<(), DataError> {
        self.flush_slots(Some(ino), false, true)
    }

    /// [`Self::flush`] without trying full servers again: Err when the inode has a failure
    /// pinned (a `stat` settles writes before the size is reported, and withdraws it).
    pub fn settle(&self, ino: Ino) -> Result<(), DataError> {
        self.flush_slots(Some(ino), false, false)
    }

    /// [`Self::flush`], then every server holding writes of `ino` that no sync covered syncs
    /// its SSD log: what `fsync` promises (the data survives a server crash).
    pub fn sync(&self, ino: Ino) -> Result<(), DataError> {
        self.flush_slots(Some(ino), true, true)
    }

    /// Flushes every slot's pipeline; the first failure.
    pub fn flush_all(&self) -> Result<(), DataError> {
        self.flush_slots(None, false, true)
    }

    /// Forgets cached store handles of `ino` (at open: close-to-open means asking again).
    pub fn forget(&self, ino: Ino) {
        self.tell_slots(ino, || Command::Forget { ino });
    }

    /// The last handle of `ino` is closed: its failure, reported to every close and fsync so
    /// far, is forgotten (a new open starts clean).
    pub fn release(&self, ino: Ino) {
        self.tell_slots(ino, || Command::Release { ino });
    }

    /// The slots that may hold bytes of `ino`; every slot for `None`.
    fn slots_of(&self, ino: Option<Ino>) -> std::ops::Range<usize> {
        match ino {
            Some(ino) if !self.route.spread => {
                let home = self.route.slot(ino, 0);
                home..home + 1
            }
            _ => 0..self.slots.len(),
        }
    }

    fn flush_slots(&self, ino: Option<Ino>, durable: bool, report: bool) -> Result<(), DataError> {
        self.on_slots(
            ino,
            false,
            |slot| slot.flush_for(durable, ino, report),
            |reply| Command::Flush { durable, ino, report, reply },
        )
    }

    /// Runs an operation on every slot that may hold bytes of `ino` (`invalidate`: dropping
    /// the inode's readahead windows first), the worker slots' all queued before any is
    /// waited for; the first failure, in slot order.
    fn on_slots(
        &self,
        ino: Option<Ino>,
        invalidate: bool,
        inline: impl Fn(&mut Slot) -> Result<(), DataError>,
        make: impl Fn(Reply<()>) -> Command,
    ) -> Result<(), DataError> {
        // What each slot answered, or the channel its worker will answer on.
        enum Answer {
            Done(Result<(), DataError>),
            Pending(Receiver<Result<(), DataError>>),
        }
        let mut answers = Vec::new();
        for index in self.slots_of(ino) {
            let mut guard = self.slot_at(index);
            if let (true, Some(ino)) = (invalidate, ino) {
                guard.invalidate(ino);
            }
            let answer = match &mut guard.held {
                Held::Inline(slot) => Answer::Done(inline(slot)),
                Held::Worker { queue, .. } => {
                    let (reply, answer) = sync_channel(1);
                    match queue.push(make(reply)) {
                        Ok(()) => Answer::Pending(answer),
                        Err(_) => Answer::Done(Err(DataError::Stopped { slot: index })),
                    }
                }
            };
            answers.push((index, answer));
        }
        let mut first = None;
        for (index, answer) in answers {
            let result = match answer {
                Answer::Done(result) => result,
                Answer::Pending(answer) => {
                    answer.recv().unwrap_or(Err(DataError::Stopped { slot: index }))
                }
            };
            if let Err(e) = result {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Sends a command that has no answer to every slot that may hold bytes of `ino`, after
    /// dropping its readahead windows of the inode.
    fn tell_slots(&self, ino: Ino, command: impl Fn() -> Command) {
        for index in self.slots_of(Some(ino)) {
            let mut slot = self.slot_at(index);
            slot.invalidate(ino);
            // A stopped worker has nothing cached or pinned.
            let _ = slot.send(command());
        }
    }

    fn slot_at(&self, index: usize) -> SlotGuard<'_> {
        let channel = &self.slots[index];
        let held = match channel.runner.as_ref().expect("open until drop") {
            Runner::Worker(queue) => Held::Worker { readahead: channel.lock.lock(), queue },
            // The slot's own lock orders its operations as the file-system lock orders a
            // worker's queue: one lock per operation, not two.
            Runner::Inline(slot) => Held::Inline(slot.lock()),
        };
        SlotGuard { held, index, route: self.route, writers: &self.writers }
    }

    /// After a window served a read at `offset` of a file of `size` bytes: starts fetching the
    /// next [`STRIPES_PREFETCHED`] stripes' first windows, each on the slot serving it, unless
    /// that slot is busy (a read must not wait for another slot's lock to start a fetch it may
    /// not need; the next read of the stripe tries again).
    fn prefetch_next(&self, ino: Ino, generation: u64, offset: u64, size: u64) {
        if !self.route.spread {
            return;
        }
        let mut next = offset;
        for _ in 0..STRIPES_PREFETCHED {
            next = self.route.piece_end(next);
            if next >= size {
                return;
            }
            let index = self.route.slot(ino, next);
            let channel = &self.slots[index];
            let Some(Runner::Worker(queue)) = channel.runner.as_ref() else { return };
            let Some(mut readahead) = channel.lock.try_lock() else { continue };
            let mut fetch = SlotFetch { queue, slot: index, route: self.route, ino, generation };
            readahead.prefetch(&mut fetch, ino, generation, next, size);
        }
    }

    /// The capacity of every server of the reservation (`statfs` of the mount), asked through
    /// the first slot.
    pub fn store_capacity(&self) -> Result<StoreCapacity, DataError> {
        self.slot_at(0).call(|slot| slot.store_capacity(), |reply| Command::StoreCapacity { reply })
    }
}

/// Reads and writes of one file ([`DataPlane::file`]).
pub struct FileAccess<'a> {
    plane: &'a DataPlane,
    ino: Ino,
    _shared: RwLockReadGuard<'a, ()>,
}

impl FileAccess<'_> {
    /// Writes `data` at `offset`, each stripe's piece through the slot serving it (see
    /// [`SlotGuard::write`]). The write fails, if at all, by the next flush of the file.
    pub fn write(&self, generation: u64, offset: u64, data: &[u8]) -> Result<(), DataError> {
        let ino = self.ino;
        let end = offset.saturating_add(data.len() as u64);
        let _range = self.plane.route.spread.then(|| self.plane.ranges.hold(ino, offset, end));
        for (index, at, length) in self.plane.route.pieces(ino, offset, data.len() as u64) {
            let from = (at - offset) as usize;
            let piece = &data[from..from + length as usize];
            self.plane.slot_at(index).write(ino, generation, at, piece)?;
        }
        Ok(())
    }

    /// Fills `buffer` from `offset`, after every write queued before; unwritten bytes are
    /// zeros. `size` is the file's size, past which readahead never reads.
    pub fn read(
        &self,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<(), DataError> {
        let ino = self.ino;
        let end = offset.saturating_add(buffer.len() as u64);
        let across = self.plane.route.piece_end(offset) < end;
        let _range = across.then(|| self.plane.ranges.hold(ino, offset, end));
        for (index, at, length) in self.plane.route.pieces(ino, offset, buffer.len() as u64) {
            let from = (at - offset) as usize;
            let piece = &mut buffer[from..from + length as usize];
            let windowed = self.plane.slot_at(index).read(ino, generation, at, piece, size)?;
            if windowed {
                self.plane.prefetch_next(ino, generation, at, size);
            }
        }
        Ok(())
    }

    /// [`Self::read`] of `length` bytes handed to `deliver` (the FUSE reply), straight from a
    /// readahead window where one serves them: no buffer to fill and copy again.
    pub fn read_with<R>(
        &self,
        generation: u64,
        offset: u64,
        length: usize,
        size: u64,
        deliver: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, DataError> {
        let ino = self.ino;
        if self.plane.route.piece_end(offset) < offset.saturating_add(length as u64) {
            // Across stripes of different slots: gathered into one buffer.
            let mut buffer = vec![0u8; length];
            self.read(generation, offset, &mut buffer, size)?;
            return Ok(deliver(&buffer));
        }
        let index = self.plane.route.slot(ino, offset);
        let (delivered, windowed) =
            self.plane.slot_at(index).read_with(ino, generation, offset, length, size, deliver)?;
        if windowed {
            self.plane.prefetch_next(ino, generation, offset, size);
        }
        Ok(delivered)
    }
}

/// One file held alone ([`DataPlane::exclusive`]).
pub struct FileExclusive<'a> {
    plane: &'a DataPlane,
    ino: Ino,
    _alone: RwLockWriteGuard<'a, ()>,
}

impl FileExclusive<'_> {
    /// See [`DataPlane::settle`].
    pub fn settle(&self) -> Result<(), DataError> {
        self.plane.settle(self.ino)
    }

    /// See [`Slot::zero_fill`]: every slot zeroes the stripes it serves.
    pub fn zero_fill(&self, generation: u64, from: u64, to: u64) -> Result<(), DataError> {
        let ino = self.ino;
        self.plane.on_slots(
            Some(ino),
            true,
            |slot| slot.zero_fill(ino, generation, from, to),
            |reply| Command::ZeroFill { ino, generation, from, to, reply },
        )
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

/// A locked slot: the data operations of the stripes it serves.
struct SlotGuard<'a> {
    held: Held<'a>,
    index: usize,
    route: Route,
    writers: &'a AtomicUsize,
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
            Held::Worker { .. } => {
                let (reply, answer) = sync_channel(1);
                self.send(make(reply))?;
                answer.recv().map_err(|_| DataError::Stopped { slot: self.index })?
            }
        }
    }

    /// Queues a write of `data` at `offset` (copied into the worker's queue; an inline slot,
    /// or a worker slot while the file system has several writes in progress, hands the slice
    /// to its client, which sends or gathers it before this returns). The write fails, if at
    /// all, by the next flush of the slot.
    fn write(
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
                    // holder queues, prefetches included, so the order of the slot's
                    // operations is kept).
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

    /// Fills `buffer` from `offset` (bytes this slot serves), after every write queued before;
    /// unwritten bytes are zeros. `size` is the file's size, past which readahead never reads.
    /// True when a readahead window served it (the reader is sequential).
    fn read(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<bool, DataError> {
        let (index, route) = (self.index, self.route);
        match &mut self.held {
            Held::Inline(slot) => slot.read_ahead(ino, generation, offset, buffer, size),
            Held::Worker { readahead, queue } => {
                let mut fetch = SlotFetch { queue, slot: index, route, ino, generation };
                readahead.read_through(&mut fetch, ino, generation, offset, buffer, size)
            }
        }
    }

    /// [`Self::read`] of `length` bytes handed to `deliver` (the FUSE reply), straight from a
    /// readahead window where one serves them: no buffer to fill and copy again.
    fn read_with<R>(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        length: usize,
        size: u64,
        deliver: impl FnOnce(&[u8]) -> R,
    ) -> Result<(R, bool), DataError> {
        let (index, route) = (self.index, self.route);
        match &mut self.held {
            Held::Inline(slot) => {
                let mut buffer = vec![0u8; length];
                let windowed = slot.read_ahead(ino, generation, offset, &mut buffer, size)?;
                Ok((deliver(&buffer), windowed))
            }
            Held::Worker { readahead, queue } => {
                let mut fetch = SlotFetch { queue, slot: index, route, ino, generation };
                if let Some(bytes) =
                    readahead.serve(&mut fetch, ino, generation, offset, length, size)?
                {
                    return Ok((deliver(bytes), true));
                }
                let bytes = fetch.read(offset, vec![0u8; length])?;
                Ok((deliver(&bytes), false))
            }
        }
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

/// Reads of the stripes of one inode that a worker slot serves, through its queue.
struct SlotFetch<'a> {
    queue: &'a Queue,
    slot: usize,
    route: Route,
    ino: Ino,
    generation: u64,
}

impl Fetch for SlotFetch<'_> {
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

    /// Only the stripe under `offset`, and only if this slot serves it: a stripe's bytes are
    /// read through the client that wrote them, which alone knows of writes a server restart
    /// lost there.
    fn limit(&self, offset: u64) -> u64 {
        if self.route.serves(self.slot, self.ino, offset) {
            self.route.piece_end(offset)
        } else {
            offset
        }
    }

    /// A read at a stripe's start may continue one served by another slot.
    fn starts_piece(&self, offset: u64) -> bool {
        self.route.spread && offset.is_multiple_of(SLOT_STRIPE_BYTES)
    }
}

impl SlotFetch<'_> {
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
    /// This slot's place in the plane, and the plane's map of bytes to slots.
    index: usize,
    route: Route,
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
        match flushed {
            Ok(()) => self.dirty.clear(),
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
        self.report_lost(ino)
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
    /// slot, which fetches no window in the background; true when a window served it.
    pub fn read_ahead(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<bool, DataError> {
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
        // One small record per stripe unit on each server, whatever the range's length; only
        // the stripes this slot serves (the other slots zero theirs).
        for (index, at, length) in self.route.pieces(ino, from, end - from) {
            if index != self.index {
                continue;
            }
            self.client.write_zeros(handle, at, length).map_err(|source| DataError::Client {
                operation: "zero-fill",
                file: name.clone(),
                offset: at,
                length,
                source: Box::new(source),
            })?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    const STRIPE: u64 = SLOT_STRIPE_BYTES;

    #[test]
    fn every_run_of_stripes_visits_every_slot_once_and_runs_differ() {
        let route = Route { slots: 4, spread: true };
        for ino in [1, 2, 3, 77, u64::MAX] {
            let mut orders = HashSet::new();
            for run in 0..64u64 {
                let order: Vec<usize> =
                    (0..4).map(|i| route.slot(ino, (run * 4 + i) * STRIPE + 17)).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, [0, 1, 2, 3], "inode {ino} run {run}: {order:?}");
                orders.insert(order);
            }
            // Not one fixed rotation: writers a whole number of runs apart would line up.
            assert!(orders.len() > 1, "inode {ino}");
        }
        // IOR's four writers of one shared file, 64 MiB apart: not all on one slot.
        let writers: HashSet<usize> = (0..4).map(|w| route.slot(9, w * (64 << 20))).collect();
        assert!(writers.len() > 1);
        // Inline slots: a file is one slot's, `ino % slots`, wherever the byte.
        let inline = Route { slots: 4, spread: false };
        assert!((0..100).all(|k| inline.slot(6, k * STRIPE) == 2));
        assert_eq!(inline.piece_end(5), u64::MAX);
    }

    #[test]
    fn pieces_cut_a_range_where_the_slot_changes_and_cover_it_exactly() {
        let route = Route { slots: 3, spread: true };
        let cases =
            [(0, 1), (STRIPE - 1, 2), (5, 3 * STRIPE), (STRIPE, STRIPE), (7 * STRIPE + 3, 0)];
        for (offset, length) in cases {
            let pieces: Vec<(usize, u64, u64)> = route.pieces(41, offset, length).collect();
            let mut at = offset;
            for &(slot, from, len) in &pieces {
                assert_eq!(from, at, "contiguous");
                assert!(len > 0 && from + len <= route.piece_end(from), "inside one stripe");
                assert_eq!(slot, route.slot(41, from));
                assert!(route.serves(slot, 41, from + len - 1));
                at += len;
            }
            assert_eq!(at, offset + length, "{offset}+{length}: {pieces:?}");
        }
        // A range at the end of the offsets ends there, not past it.
        let last: Vec<_> = route.pieces(1, u64::MAX - 10, 100).collect();
        assert_eq!(last.iter().map(|p| p.2).sum::<u64>(), 10);
    }
}
