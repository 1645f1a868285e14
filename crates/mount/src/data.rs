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
//! ([`DataPlane`]), one per slot, each behind a mutex. One file's I/O spreads over the slots
//! by stripe ([`SLOT_STRIPE_BYTES`], the store's stripe unit): stripe `k` of inode `i` always
//! goes through slot `mix(i, k) % slots`, for writes and reads alike (a request crossing
//! stripes is split), so
//! - writes of one file go out on several clients at once, and two writes of the same bytes
//!   take the same pipeline and land in the order the file system received them;
//! - readers of one file read in parallel, and a read sees every write of this mount that
//!   returned before it (its stripe's slot sends its queued writes first, and the client
//!   flushes before it reads);
//! - the client that wrote a stripe reads it back, so writes a server restart lost fail the
//!   read (EIO) instead of reading as zeros: only that client knows it wrote them.
//!
//! A write is copied onto its slot's queue and the kernel answered at once (write-behind, at
//! most [`QUEUED_WRITES_MAX`] writes, i.e. that many MiB, per slot); the slot's sender thread
//! sends them pipelined, and whoever locks the slot for anything else sends what is queued
//! first. The plane remembers which slots hold writes of each inode that the servers have not
//! acknowledged yet, so a close, fsync or size report settles just those.
//!
//! A failure is pinned on every inode the slot wrote since its last flush (a pipelined failure
//! does not say whose write it was) and reported to every flush (close) and fsync of the inode
//! until its last handle is released; the file system then withdraws the size those writes
//! claimed, so a file never shows zeros where the servers refused its bytes. Once the servers
//! refused a write for want of space, later writes are refused at once
//! ([`DataPlane::store_full`]) instead of each waiting out the servers' backpressure bound
//! again, until the next close or fsync tries again.
//! Each inode has a reader-writer lock (shared by a fixed set of inodes): reads, writes and
//! flushes take it shared, a truncate or zero-fill exclusive, so no write of this mount
//! interleaves with a truncate and the zero-fill that follows it.

use std::collections::{HashMap, HashSet, VecDeque};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use spillway_client::{placement, Client, ClientError, FileHandle};
use spillway_namespace::{data_file_name, Ino, NamespaceId};
use spillway_proto::ErrorCode;
use spillway_types::EpochId;

/// Store file handles kept per slot before the cache is cleared (bounds memory).
pub const HANDLES_CACHED_MAX: usize = 4096;
/// Zero-filling writes this many bytes per request.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Bytes of a file written through the same slot before the next slot takes over (the store's
/// stripe unit and the largest FUSE write: a sequential 1 MiB write is never split).
pub const SLOT_STRIPE_BYTES: u64 = 1 << 20;
/// Writes queued per slot before a writer waits (each at most `max_write`, 1 MiB).
pub const QUEUED_WRITES_MAX: usize = 16;
/// Slots at most (a slot set of an inode is a 64-bit mask).
pub const SLOTS_MAX: usize = 64;
/// Inode locks, shared by inodes equal modulo this count.
const INODE_LOCKS: usize = 64;

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
    #[error("asking the reservation's servers for their capacity: {0}")]
    Status(Box<ClientError>),
    /// The servers refused an earlier write for want of space: this one is refused without
    /// being sent (a close or fsync of any file tries the servers again).
    #[error("the reservation's servers are full: write refused at once after an earlier one was refused for want of space (close or fsync to try again)")]
    StoreFull,
    /// A write through a data slot failed while this file had writes in flight on it; a
    /// pipelined failure does not say whose write it was, so this file's writes since that
    /// slot's last flush may not be stored.
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
            DataError::EpochVanished { .. } => return libc::EIO,
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

/// What every slot of a plane shares.
struct Shared {
    namespace: NamespaceId,
    epoch: EpochId,
    /// Some server held the data epoch since the mount started: from then on an epoch on no
    /// server has vanished, and its files read as EIO, not zeros.
    epoch_seen: AtomicBool,
    /// See [`DataPlane::store_full`].
    store_full: AtomicBool,
    /// Inodes some of whose writes may not be stored, and why; reported to every close and
    /// fsync of the inode, forgotten when its last handle is released.
    failed: Mutex<HashMap<Ino, DataError>>,
    /// Inode → its writes the servers have not acknowledged yet. Bounded by the stripes
    /// written since the slots' last flushes.
    unacked: Mutex<HashMap<Ino, Unacked>>,
    /// Per slot: every queued write up to this sequence number is acknowledged (or failed and
    /// pinned). Writes are numbered per slot in queue order from 1.
    acked: Vec<AtomicU64>,
}

/// Where an inode's unacknowledged writes are.
struct Unacked {
    /// Per slot, the sequence number of the inode's last write queued there (0: none): the
    /// slots where it is above `Shared::acked` are settled before a size report or a close.
    last: Vec<u64>,
}

impl Shared {
    /// Whether write `seq` of slot `index` is still unacknowledged.
    fn pending(&self, index: usize, seq: u64) -> bool {
        seq > self.acked[index].load(Ordering::Acquire)
    }

    /// The slots holding unacknowledged writes of `ino` (bit `s` for slot `s`).
    fn unacked(&self, ino: Ino) -> u64 {
        let unacked = self.unacked.lock();
        let Some(entry) = unacked.get(&ino) else { return 0 };
        let pending = entry.last.iter().enumerate().filter(|(s, seq)| self.pending(*s, **seq));
        pending.fold(0, |mask, (s, _)| mask | 1 << s)
    }

    /// Write `seq` of `ino` is queued on slot `index`.
    fn queued(&self, ino: Ino, index: usize, seq: u64) {
        let mut unacked = self.unacked.lock();
        let entry =
            unacked.entry(ino).or_insert_with(|| Unacked { last: vec![0; self.acked.len()] });
        entry.last[index] = entry.last[index].max(seq);
    }

    /// Forgets what of `inodes` is acknowledged now.
    fn forget_acknowledged(&self, inodes: impl Iterator<Item = Ino>) {
        let mut unacked = self.unacked.lock();
        for ino in inodes {
            let Some(entry) = unacked.get(&ino) else { continue };
            if !entry.last.iter().enumerate().any(|(s, seq)| self.pending(s, *seq)) {
                unacked.remove(&ino);
            }
        }
    }
}

/// The data path of one mount: a pool of clients, one per slot.
pub struct DataPlane {
    slots: Vec<Arc<SlotCell>>,
    /// One sender thread per slot; `stop` ends them at unmount.
    senders: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    inode_locks: Vec<RwLock<()>>,
    shared: Arc<Shared>,
    /// Where [`Self::any_slot`] starts looking for a free slot.
    next_read: AtomicUsize,
    /// Writes in progress (FUSE requests), for [`InodeGuard::write`]'s choice.
    writers: AtomicUsize,
}

struct SlotCell {
    slot: Mutex<Slot>,
    /// Writes answered but not sent yet (write-behind), oldest first, with the sequence number
    /// the last one queued took; sent by the slot's sender thread, or first by whoever locks
    /// the slot next, so nothing overtakes them.
    queue: Mutex<(VecDeque<QueuedWrite>, u64)>,
    /// Signalled when the queue gains a write (the sender waits) or loses one (writers wait
    /// for room), and at unmount.
    changed: Condvar,
    /// Inodes opened since the slot last ran: their cached handles are dropped before its next
    /// operation (close-to-open), without waiting for the slot at open. `None` inside: too
    /// many, drop every cached handle.
    forgets: Mutex<Option<Vec<Ino>>>,
}

struct QueuedWrite {
    ino: Ino,
    generation: u64,
    offset: u64,
    data: Vec<u8>,
    seq: u64,
}

impl SlotCell {
    /// Sends every queued write, oldest first, with the slot held; failures are pinned on the
    /// files written.
    fn drain(&self, slot: &mut Slot) {
        loop {
            let next = self.queue.lock().0.pop_front();
            let Some(write) = next else { return };
            self.changed.notify_all();
            let _ = slot.write(write.ino, write.generation, write.offset, &write.data);
            slot.sent = slot.sent.max(write.seq);
        }
    }

    /// Queues a copy of `data`, waiting while the queue is full; its sequence number.
    fn enqueue(&self, ino: Ino, generation: u64, offset: u64, data: &[u8]) -> u64 {
        let data = data.to_vec();
        let mut queue = self.queue.lock();
        while queue.0.len() >= QUEUED_WRITES_MAX {
            self.changed.wait(&mut queue);
        }
        queue.1 += 1;
        let seq = queue.1;
        queue.0.push_back(QueuedWrite { ino, generation, offset, data, seq });
        drop(queue);
        self.changed.notify_all();
        seq
    }

    /// Sends a write from the caller's thread (no copy), after every write queued before it;
    /// its sequence number and the outcome (a failure is also pinned).
    fn send_now(
        &self,
        slot: &mut Slot,
        ino: Ino,
        generation: u64,
        offset: u64,
        data: &[u8],
    ) -> (u64, Result<(), DataError>) {
        // Numbered while the queue is empty and the slot held: everything numbered before is
        // sent, everything after waits for the slot.
        let seq = loop {
            self.drain(slot);
            let mut queue = self.queue.lock();
            if queue.0.is_empty() {
                queue.1 += 1;
                break queue.1;
            }
        };
        let sent = slot.write(ino, generation, offset, data);
        slot.sent = slot.sent.max(seq);
        (seq, sent)
    }

    /// The sender thread: sends queued writes as they come until `stop`.
    fn send_queued(&self, stop: &AtomicBool) {
        loop {
            {
                let mut queue = self.queue.lock();
                while queue.0.is_empty() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    self.changed.wait(&mut queue);
                }
            }
            let mut slot = self.slot.lock();
            self.drain(&mut slot);
        }
    }
}

/// What the reservation's servers hold for files, over all of them: bytes of SSD log in all
/// and free, divided by the copies every byte takes (`replicas`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreCapacity {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// The bits set in `mask`, lowest first.
fn slots_of(mask: u64) -> impl Iterator<Item = usize> {
    (0..SLOTS_MAX).filter(move |s| mask & (1 << s) != 0)
}

impl DataPlane {
    /// `clients` must all be connected to the same servers, in the same order, with the
    /// default striped placement (one per slot; at least one; beyond [`SLOTS_MAX`] unused).
    pub fn new(clients: Vec<Client>, namespace: NamespaceId, epoch: EpochId) -> DataPlane {
        assert!(!clients.is_empty(), "a data plane needs at least one client");
        let shared = Arc::new(Shared {
            namespace,
            epoch,
            epoch_seen: AtomicBool::new(false),
            store_full: AtomicBool::new(false),
            failed: Mutex::new(HashMap::new()),
            unacked: Mutex::new(HashMap::new()),
            acked: (0..clients.len().min(SLOTS_MAX)).map(|_| AtomicU64::new(0)).collect(),
        });
        let slots: Vec<Arc<SlotCell>> = clients
            .into_iter()
            .take(SLOTS_MAX)
            .enumerate()
            .map(|(index, mut client)| {
                client.begin_epoch(epoch);
                let slot = Slot {
                    index,
                    client,
                    handles: HashMap::new(),
                    dirty: HashSet::new(),
                    sent: 0,
                    shared: shared.clone(),
                };
                Arc::new(SlotCell {
                    slot: Mutex::new(slot),
                    queue: Mutex::new((VecDeque::new(), 0)),
                    changed: Condvar::new(),
                    forgets: Mutex::new(Some(Vec::new())),
                })
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let senders = slots
            .iter()
            .enumerate()
            .map(|(index, cell)| {
                let (cell, stop) = (cell.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("mount-data-{index}"))
                    .spawn(move || cell.send_queued(&stop))
                    .expect("spawning a data sender thread")
            })
            .collect();
        DataPlane {
            slots,
            senders,
            stop,
            inode_locks: (0..INODE_LOCKS).map(|_| RwLock::new(())).collect(),
            shared,
            next_read: AtomicUsize::new(0),
            writers: AtomicUsize::new(0),
        }
    }

    /// The servers refused a write for want of space since the last close or fsync: writes are
    /// refused at once (ENOSPC at `write(2)`), so a full burst buffer costs one backpressure
    /// wait (`server.backpressure_wait_ms_max`), not one per batch of writes.
    pub fn store_full(&self) -> bool {
        self.shared.store_full.load(Ordering::Relaxed)
    }

    /// The data operations of inode `ino`, with its lock held shared (reads, writes, flushes).
    pub fn inode(&self, ino: Ino) -> InodeGuard<'_> {
        let lock = &self.inode_locks[(ino % INODE_LOCKS as u64) as usize];
        InodeGuard { plane: self, ino, _lock: InodeLock::Shared { _guard: lock.read() } }
    }

    /// [`Self::inode`] with the lock held exclusive: no other data operation of the inode runs
    /// meanwhile (a truncate and its zero-fill).
    pub fn inode_exclusive(&self, ino: Ino) -> InodeGuard<'_> {
        let lock = &self.inode_locks[(ino % INODE_LOCKS as u64) as usize];
        InodeGuard { plane: self, ino, _lock: InodeLock::Exclusive { _guard: lock.write() } }
    }

    /// Forgets cached store handles of `ino` in every slot (at open: close-to-open means asking
    /// the servers again), before each slot's next operation.
    pub fn forget(&self, ino: Ino) {
        for cell in &self.slots {
            let mut forgets = cell.forgets.lock();
            if let Some(list) = forgets.as_mut() {
                if list.len() >= HANDLES_CACHED_MAX {
                    *forgets = None;
                } else {
                    list.push(ino);
                }
            }
        }
    }

    /// The last handle of `ino` is closed: its failure, reported to every close and fsync so
    /// far, is forgotten (a new open starts clean).
    pub fn release(&self, ino: Ino) {
        self.shared.failed.lock().remove(&ino);
    }

    /// Slot `index`, locked, with the handles of files opened since dropped and its queued
    /// writes sent (nothing of this mount's overtakes them).
    fn lock_slot(&self, index: usize) -> MutexGuard<'_, Slot> {
        let cell = &self.slots[index];
        let mut slot = cell.slot.lock();
        Self::apply_forgets(cell, &mut slot);
        cell.drain(&mut slot);
        slot
    }

    fn apply_forgets(cell: &SlotCell, slot: &mut Slot) {
        let forgets = cell.forgets.lock().replace(Vec::new());
        match forgets {
            Some(list) if list.is_empty() => {}
            Some(list) => {
                let opened: HashSet<Ino> = list.into_iter().collect();
                slot.handles.retain(|(ino, _), _| !opened.contains(ino));
            }
            None => slot.handles.clear(),
        }
    }

    /// A free slot if there is one (tried from a rotating start), else the start, waited for.
    fn any_slot(&self) -> MutexGuard<'_, Slot> {
        let count = self.slots.len();
        let start = self.next_read.fetch_add(1, Ordering::Relaxed) % count;
        for k in 0..count {
            let cell = &self.slots[(start + k) % count];
            if let Some(mut slot) = cell.slot.try_lock() {
                Self::apply_forgets(cell, &mut slot);
                cell.drain(&mut slot);
                return slot;
            }
        }
        self.lock_slot(start)
    }

    /// The slot of stripe `stripe` of `ino`: every write and read of those bytes goes through
    /// it. Mixed, not `(ino + stripe) % slots`: that lined up writers of one file whose
    /// segments are a multiple of `slots` stripes apart (IOR's shared layout) on one slot.
    fn stripe_slot(&self, ino: Ino, stripe: u64) -> usize {
        // splitmix64's finaliser.
        let mut x = ino.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(stripe);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        (x % self.slots.len() as u64) as usize
    }

    /// Settles every slot holding writes of `ino` the servers have not acknowledged (their
    /// failures are pinned on the files they wrote).
    fn settle_unacked(&self, ino: Ino) {
        for index in slots_of(self.shared.unacked(ino)) {
            self.lock_slot(index).settle();
        }
    }

    /// The capacity of every server of the reservation (`statfs` of the mount), asked through
    /// any free slot.
    pub fn store_capacity(&self) -> Result<StoreCapacity, DataError> {
        self.any_slot().store_capacity()
    }

    /// Flushes every slot's pipeline; the first failure (of any file).
    pub fn flush_all(&self) -> Result<(), DataError> {
        self.flush(None, false, true)
    }

    /// Flushes (`durable`: syncs) the slots and reports what failed for `ino` (for `None`, the
    /// unmount's flush, for any inode); with `report` false only says whether something did.
    /// A close or fsync is where the servers are tried again after they were full.
    fn flush(&self, ino: Option<Ino>, durable: bool, report: bool) -> Result<(), DataError> {
        let every = u64::MAX >> (SLOTS_MAX - self.slots.len());
        // A sync must reach every server any slot wrote the inode to, even if acknowledged.
        let mask = match ino {
            Some(ino) if !durable => self.shared.unacked(ino),
            _ => every,
        };
        let mut sync_failure = None;
        for index in slots_of(mask) {
            let mut slot = self.lock_slot(index);
            if durable {
                if let Err(e) = slot.sync() {
                    sync_failure.get_or_insert(e);
                }
            } else {
                slot.settle();
            }
        }
        if report {
            // A close or fsync is where writes try the servers again.
            self.shared.store_full.store(false, Ordering::Relaxed);
        }
        {
            let failed = self.shared.failed.lock();
            let failure = match ino {
                Some(ino) => failed.get(&ino),
                None => failed.values().next(),
            };
            if let Some(e) = failure {
                return Err(DataError::SlotFailure { errno: e.errno(), message: e.to_string() });
            }
        }
        if let Some(e) = sync_failure {
            return Err(e);
        }
        let Some(ino) = ino.filter(|_| report) else { return Ok(()) };
        // Any slot may have written the file: each says whether a server restart lost some.
        let mut first = None;
        for index in 0..self.slots.len() {
            if let Err(e) = self.lock_slot(index).report_lost(ino) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for cell in &self.slots {
            // Under the queue lock, so a sender checking `stop` cannot miss the wake-up.
            let _queue = cell.queue.lock();
            cell.changed.notify_all();
        }
        for sender in self.senders.drain(..) {
            let _ = sender.join();
        }
        for cell in &self.slots {
            let mut slot = cell.slot.lock();
            cell.drain(&mut slot);
            if let Err(e) = slot.flush() {
                tracing::error!(error = %e, "flushing writes at unmount failed");
            }
        }
    }
}

/// Held, never read: dropping it releases the inode.
enum InodeLock<'a> {
    Shared { _guard: RwLockReadGuard<'a, ()> },
    Exclusive { _guard: RwLockWriteGuard<'a, ()> },
}

/// The data operations of one inode, its lock held.
pub struct InodeGuard<'a> {
    plane: &'a DataPlane,
    ino: Ino,
    _lock: InodeLock<'a>,
}

impl InodeGuard<'_> {
    /// Writes `data` at `offset`, each stripe through its slot; it fails, if at all, by the
    /// next flush of the inode (at once if the servers are full or the slot knows of a
    /// failure).
    ///
    /// Write-behind (a copy queued, the kernel answered before the bytes are sent) pays when
    /// this is the only write in progress: the application's next write then overlaps this
    /// one's sending (one sequential writer: 0.45× the native client sending in the FUSE
    /// thread, 0.68× queued). With several in progress their sending overlaps anyway and the
    /// copy costs more than it saves, so the FUSE thread sends itself (IOR file per process:
    /// about 0.56× queued, 0.9–1.1× sent directly; measured on this 2-core machine).
    pub fn write(&self, generation: u64, offset: u64, data: &[u8]) -> Result<(), DataError> {
        let writers = &self.plane.writers;
        let queued = writers.fetch_add(1, Ordering::AcqRel) == 0;
        let written = self.write_stripes(generation, offset, data, queued);
        writers.fetch_sub(1, Ordering::AcqRel);
        written
    }

    fn write_stripes(
        &self,
        generation: u64,
        offset: u64,
        data: &[u8],
        queued: bool,
    ) -> Result<(), DataError> {
        let mut at = 0usize;
        while at < data.len() {
            if self.plane.store_full() {
                return Err(DataError::StoreFull);
            }
            let position = offset + at as u64;
            let stripe = position / SLOT_STRIPE_BYTES;
            let stripe_end = (stripe + 1) * SLOT_STRIPE_BYTES;
            let length = ((stripe_end - position) as usize).min(data.len() - at);
            let index = self.plane.stripe_slot(self.ino, stripe);
            let piece = &data[at..at + length];
            let cell = &self.plane.slots[index];
            if queued {
                let seq = cell.enqueue(self.ino, generation, position, piece);
                self.plane.shared.queued(self.ino, index, seq);
            } else {
                let mut slot = self.plane.lock_slot(index);
                let (seq, sent) = cell.send_now(&mut slot, self.ino, generation, position, piece);
                self.plane.shared.queued(self.ino, index, seq);
                sent?;
            }
            at += length;
        }
        Ok(())
    }

    /// Fills `buffer` from `offset`, after every write of this mount that returned before;
    /// unwritten bytes are zeros.
    ///
    /// Each stripe is read through its own slot, behind that slot's writes (consecutive
    /// stripes of one slot in one request): the client that wrote bytes is the one that knows
    /// whether a server restart lost them, so it reads them (an error then, never zeros).
    pub fn read(&self, generation: u64, offset: u64, buffer: &mut [u8]) -> Result<(), DataError> {
        let mut at = 0usize;
        while at < buffer.len() {
            let index = self.plane.stripe_slot(self.ino, (offset + at as u64) / SLOT_STRIPE_BYTES);
            let mut end = at;
            while end < buffer.len() {
                let stripe = (offset + end as u64) / SLOT_STRIPE_BYTES;
                if self.plane.stripe_slot(self.ino, stripe) != index {
                    break;
                }
                let stripe_end = ((stripe + 1) * SLOT_STRIPE_BYTES - offset) as usize;
                end = stripe_end.min(buffer.len());
            }
            let piece = &mut buffer[at..end];
            self.plane.lock_slot(index).read(self.ino, generation, offset + at as u64, piece)?;
            at = end;
        }
        Ok(())
    }

    /// See [`Slot::zero_fill`]; the zeros are acknowledged when this returns, so a later write
    /// of the same bytes through another slot cannot be overtaken by them.
    pub fn zero_fill(&self, generation: u64, from: u64, to: u64) -> Result<(), DataError> {
        // Every earlier write of the inode lands first, and the zeros before any later one.
        self.plane.settle_unacked(self.ino);
        self.plane.any_slot().zero_fill(self.ino, generation, from, to)
    }

    /// Waits until every write of the inode sent so far is acknowledged by its server; the
    /// inode's failure, if any: what `close` reports. FUSE sends a flush for every close of a
    /// descriptor, also the ones a forked child closes at exec, so the failure is reported to
    /// every close and fsync until the last handle is released, never to just the first.
    pub fn flush(&self) -> Result<(), DataError> {
        self.plane.flush(Some(self.ino), false, true)
    }

    /// [`Self::flush`] without trying full servers again: Err when the inode has a failure
    /// pinned (a `stat` settles writes before the size is reported, and withdraws it).
    pub fn settle(&self) -> Result<(), DataError> {
        self.plane.flush(Some(self.ino), false, false)
    }

    /// [`Self::flush`], then every server any slot wrote to syncs its SSD log: what `fsync`
    /// promises (the data survives a server crash).
    pub fn sync(&self) -> Result<(), DataError> {
        self.plane.flush(Some(self.ino), true, true)
    }
}

/// One client of the pool and the store file handles it has resolved.
pub struct Slot {
    index: usize,
    client: Client,
    /// (ino, generation) → handle covering every server of the file's stripe set.
    handles: HashMap<(Ino, u64), FileHandle>,
    /// Inodes written through this slot since its last flush: a failure found meanwhile may
    /// be any of theirs. Bounded by the open files the slot serves.
    dirty: HashSet<Ino>,
    /// Sequence number of the last queued write sent through this slot.
    sent: u64,
    shared: Arc<Shared>,
}

impl Slot {
    /// Pins `error` on every inode written since the last flush (the first keeps the error
    /// itself, the others its errno and message) and, for want of space, refuses later writes.
    fn fail_dirty(&mut self, error: DataError) {
        let errno = error.errno();
        if errno == libc::ENOSPC || errno == libc::EDQUOT {
            self.shared.store_full.store(true, Ordering::Relaxed);
        }
        let message = error.to_string();
        let mut first = Some(error);
        {
            let mut failed = self.shared.failed.lock();
            for ino in &self.dirty {
                let error = first
                    .take()
                    .unwrap_or_else(|| DataError::SlotFailure { errno, message: message.clone() });
                failed.entry(*ino).or_insert(error);
            }
        }
        if first.is_some() {
            tracing::warn!(%message, "a data failure with no file written since the last flush");
        }
    }

    /// The writes sent so far are settled by a flush (acknowledged, or failed and pinned: they
    /// will not land later).
    fn acknowledged(&mut self) {
        self.shared.acked[self.index].store(self.sent, Ordering::Release);
        let dirty = std::mem::take(&mut self.dirty);
        self.shared.forget_acknowledged(dirty.into_iter());
    }

    /// Books the outcome of a flush or sync: Ok settles the dirty inodes, a failure is pinned
    /// on them (and returned as their [`DataError::SlotFailure`]).
    fn settled(&mut self, outcome: Result<(), DataError>) -> Result<(), DataError> {
        match outcome {
            Ok(()) => {
                self.acknowledged();
                Ok(())
            }
            Err(e) => {
                let copy = DataError::SlotFailure { errno: e.errno(), message: e.to_string() };
                self.fail_dirty(e);
                self.acknowledged();
                Err(copy)
            }
        }
    }

    /// Waits until this slot's writes are acknowledged; a failure stays pinned on the files
    /// written, for their close or fsync to report.
    fn settle(&mut self) {
        let flushed = self.flush();
        let _ = self.settled(flushed);
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
        data_file_name(self.shared.namespace, ino, generation)
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
    }

    /// A handle to write through: the file is created on every server of its stripe set.
    fn writable(&mut self, ino: Ino, generation: u64) -> Result<FileHandle, DataError> {
        if let Some(handle) = self.handles.get(&(ino, generation)) {
            return Ok(handle.clone());
        }
        let name = self.name(ino, generation);
        let handle = self.client.create_file(self.shared.epoch, &name).map_err(|source| {
            DataError::Client {
                operation: "create",
                file: name.clone(),
                offset: 0,
                length: 0,
                source: Box::new(source),
            }
        })?;
        self.shared.epoch_seen.store(true, Ordering::Relaxed);
        self.remember(ino, generation, handle.clone());
        Ok(handle)
    }

    /// A handle to read through, or `None` if no server holds the file (never written).
    fn readable(&mut self, ino: Ino, generation: u64) -> Result<Option<FileHandle>, DataError> {
        if let Some(handle) = self.handles.get(&(ino, generation)) {
            return Ok(Some(handle.clone()));
        }
        let name = self.name(ino, generation);
        match self.client.open_file(self.shared.epoch, &name) {
            Ok(handle) => {
                self.shared.epoch_seen.store(true, Ordering::Relaxed);
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
                self.shared.epoch_seen.store(true, Ordering::Relaxed);
                Ok(None)
            }
            // Before any server held the epoch nothing was written: holes. After, it vanished.
            Err(ClientError::NoSuchEpoch { .. })
                if self.shared.epoch_seen.load(Ordering::Relaxed) =>
            {
                Err(DataError::EpochVanished { epoch: self.shared.epoch, file: name })
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

    /// Writes `data` at `offset` (pipelined: failures of the servers surface by the next flush
    /// of this slot). A failure known now (the slot's pipeline, full servers) is pinned on the
    /// files written since the last flush and returned.
    pub fn write(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DataError> {
        self.mark(ino);
        let sent = if self.shared.store_full.load(Ordering::Relaxed) {
            // Sending it would only wait out the servers' backpressure bound again.
            Err(DataError::StoreFull)
        } else {
            self.send(ino, generation, offset, data)
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "write failed");
            let copy = match &e {
                DataError::StoreFull => DataError::StoreFull,
                e => DataError::SlotFailure { errno: e.errno(), message: e.to_string() },
            };
            self.fail_dirty(e);
            return Err(copy);
        }
        Ok(())
    }

    /// `ino` has writes in this slot's pipeline from now until the next flush.
    fn mark(&mut self, ino: Ino) {
        self.dirty.insert(ino);
    }

    fn send(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DataError> {
        let mut handle = self.writable(ino, generation)?;
        self.client.write(&mut handle, offset, data).map_err(|source| DataError::Client {
            operation: "write",
            file: handle.name.clone(),
            offset,
            length: data.len() as u64,
            source: Box::new(source),
        })
    }

    /// Fills `buffer` from `offset`; bytes the store does not hold read as zeros.
    pub fn read(
        &mut self,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), DataError> {
        if !self.dirty.is_empty() {
            // The client flushes before it reads: book other files' writes here, so a failure
            // among them is pinned on them and not returned as this read's.
            self.settle();
        }
        let Some(handle) = self.readable(ino, generation)? else {
            buffer.fill(0);
            return Ok(());
        };
        self.client.read(&handle, offset, buffer).map_err(|source| DataError::Client {
            operation: "read",
            file: handle.name.clone(),
            offset,
            length: buffer.len() as u64,
            source: Box::new(source),
        })
    }

    /// Overwrites with zeros whatever the store holds of `[from, to)` (stale bytes left by a
    /// shrinking truncate), before the file's size grows over that range. Costs one stat per
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
        let zeros = vec![0u8; ZERO_CHUNK_BYTES];
        let mut at = from;
        while at < end {
            let length = (end - at).min(ZERO_CHUNK_BYTES as u64) as usize;
            self.mark(ino);
            if let Err(e) = self.send(ino, generation, at, &zeros[..length]) {
                return self.settled(Err(e));
            }
            at += length as u64;
        }
        let flushed = self.flush();
        self.settled(flushed)
    }

    /// Waits until every write sent through this slot is acknowledged by its server.
    pub fn flush(&mut self) -> Result<(), DataError> {
        self.client.flush().map_err(|e| DataError::Flush(Box::new(e)))
    }

    /// Flushes, then syncs the data epoch on every server this slot's client wrote it to; a
    /// failure is pinned on the files written since the last flush.
    pub fn sync(&mut self) -> Result<(), DataError> {
        let synced =
            self.client.sync_epoch(self.shared.epoch).map_err(|e| DataError::Flush(Box::new(e)));
        self.settled(synced)
    }

    /// Fails (EIO, naming the server), once, if a server restart lost writes this slot made
    /// to `ino` (any generation) that were not fsync'd: the close or fsync of the file says so.
    fn report_lost(&mut self, ino: Ino) -> Result<(), DataError> {
        let namespace = self.shared.namespace;
        let prefix = format!("ns/{namespace}/{ino}.");
        debug_assert!(data_file_name(namespace, ino, 0).starts_with(&prefix));
        self.client
            .report_lost_writes(self.shared.epoch, &prefix)
            .map_err(|e| DataError::Flush(Box::new(e)))
    }
}
