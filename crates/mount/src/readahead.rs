//! Readahead of a data slot: a sequential reader's next bytes fetched in large reads, the
//! next one while the last is being served.
//!
//! The kernel hands a FUSE mount its reads in requests of at most the bdi's `read_ahead_kb`
//! (128 KiB by default, whatever the mount asks; docs/design/mount.md, "Readahead windows in
//! the mount"), so a reader of 1 MiB records would cost eight round trips to the servers per
//! MiB, one after the other. A slot instead keeps a few *windows*: when a read continues where an earlier read of
//! the same file ended (or starts the file), the slot reads [`READAHEAD_BYTES`] from there in
//! one client read, pipelined over every server holding them, and serves the following
//! requests from memory; and once a window serves a read, the window after it is fetched in
//! the background ([`Fetch::start`]), so the servers send the next bytes while the kernel
//! copies these.
//!
//! A window holds bytes of one generation of one inode as this slot read them. Every write or
//! zero-fill of the inode through the slot drops its windows and fetches in flight (the slot is
//! the only path this mount writes the inode by, and a fetch queued before a write may have
//! read what the write replaced), and so does an open (close-to-open: bytes another mount
//! wrote and closed are read afresh) and the release of its last handle. A window never
//! reaches past the file's size when it was read; reads past a window go to the servers again.

use spillway_namespace::Ino;

/// Bytes a window holds (clamped to the file's size).
pub const READAHEAD_BYTES: usize = 2 << 20;
/// Windows one slot keeps, the least recently used replaced: two per sequential reader of the
/// slot's files, the one it reads and the next, fetched in the background (IOR's four readers
/// of one shared file share a slot; with room for one each, a fetched window replaced another
/// reader's current one, and shared-file reads ran at 0.30× the native client, not 0.44×).
pub const READAHEAD_WINDOWS_MAX: usize = 8;
/// Windows one slot fetches in the background at once. With the windows, a slot holds at most
/// `(READAHEAD_WINDOWS_MAX + READAHEAD_FETCHES_MAX + SPARE_BUFFERS_MAX) × READAHEAD_BYTES`.
pub const READAHEAD_FETCHES_MAX: usize = 4;
/// Window buffers kept for reuse (a fresh one costs page faults on every fill).
const SPARE_BUFFERS_MAX: usize = 2;
/// Read ends remembered per slot to recognise a sequential reader before it has a window.
const READ_ENDS_MAX: usize = 16;

/// How a slot reads bytes from the servers.
pub trait Fetch {
    /// A background read in flight.
    type Pending;
    type Error;
    /// Fills `bytes` (a window) from `offset` and gives them back.
    fn read(&mut self, offset: u64, bytes: Vec<u8>) -> Result<Vec<u8>, Self::Error>;
    /// Fills the caller's `buffer` from `offset` (a read no window serves).
    fn read_into(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), Self::Error>;
    /// Starts filling `bytes` from `offset` in the background; `None` when this slot cannot
    /// (an inline slot runs in the caller's thread).
    fn start(&mut self, offset: u64, bytes: Vec<u8>) -> Option<Self::Pending>;
    /// Waits for a background read.
    fn finish(&mut self, pending: Self::Pending) -> Result<Vec<u8>, Self::Error>;
}

struct Window {
    ino: Ino,
    generation: u64,
    start: u64,
    bytes: Vec<u8>,
    /// When it last served a read (the slot's read counter): the oldest is replaced.
    used: u64,
}

impl Window {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    fn of(&self, ino: Ino, generation: u64) -> bool {
        self.ino == ino && self.generation == generation
    }
}

struct InFlight<P> {
    ino: Ino,
    generation: u64,
    start: u64,
    length: usize,
    pending: P,
}

/// The windows, background fetches and recent read ends of one slot.
pub struct ReadAhead<P> {
    windows: Vec<Window>,
    fetches: Vec<InFlight<P>>,
    spare: Vec<Vec<u8>>,
    /// `(ino, generation, end)` of the latest reads that no window served, newest last.
    read_ends: Vec<(Ino, u64, u64)>,
    /// Files a window read failed for (the latest [`READ_ENDS_MAX`]): read request by request
    /// until invalidated.
    failed: Vec<(Ino, u64)>,
    reads: u64,
    /// Reads served from memory, windows read while a reader waited, and in the background.
    pub hits: u64,
    pub fills: u64,
    pub prefetches: u64,
}

impl<P> Default for ReadAhead<P> {
    fn default() -> Self {
        ReadAhead {
            windows: Vec::new(),
            fetches: Vec::new(),
            spare: Vec::new(),
            read_ends: Vec::new(),
            failed: Vec::new(),
            reads: 0,
            hits: 0,
            fills: 0,
            prefetches: 0,
        }
    }
}

impl<P> ReadAhead<P> {
    /// The bytes `[offset, offset + length)` of a file of `size` bytes if a window serves
    /// them: one that holds them, a background fetch that does, or a window's worth read now
    /// for a sequential reader. `None`: the caller reads just the request itself (remembered
    /// as read, so that the next read continuing it starts a window). Once a window served the
    /// read, the next window is fetched in the background unless it is there or on its way.
    pub fn serve<F: Fetch<Pending = P>>(
        &mut self,
        fetch: &mut F,
        ino: Ino,
        generation: u64,
        offset: u64,
        length: usize,
        size: u64,
    ) -> Result<Option<&[u8]>, F::Error> {
        self.reads += 1;
        let end = offset.saturating_add(length as u64);
        let served = match self.window_at(ino, generation, offset, end) {
            Some(index) => {
                self.hits += 1;
                index
            }
            None => match self.fetched(fetch, ino, generation, offset, end) {
                Some(index) => index,
                None => {
                    let Some(window) = self.window_length(ino, generation, offset, end, size)
                    else {
                        self.note_read(ino, generation, end);
                        return Ok(None);
                    };
                    let bytes = self.buffer(window);
                    let bytes = match fetch.read(offset, bytes) {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            // A file that fails to read (writes a restart lost, a vanished
                            // epoch) gets no more windows until it is opened again: each
                            // request would read a window's worth for nothing.
                            if self.failed.len() >= READ_ENDS_MAX {
                                self.failed.remove(0);
                            }
                            self.failed.push((ino, generation));
                            return Err(e);
                        }
                    };
                    self.fills += 1;
                    self.insert(ino, generation, offset, bytes)
                }
            },
        };
        self.windows[served].used = self.reads;
        let next = self.windows[served].end();
        self.prefetch(fetch, ino, generation, next, size);
        let window = &self.windows[served];
        let from = (offset - window.start) as usize;
        Ok(Some(&window.bytes[from..from + length]))
    }

    /// [`Self::serve`] into `buffer`; a request no window serves is read straight into it.
    pub fn read_through<F: Fetch<Pending = P>>(
        &mut self,
        fetch: &mut F,
        ino: Ino,
        generation: u64,
        offset: u64,
        buffer: &mut [u8],
        size: u64,
    ) -> Result<(), F::Error> {
        match self.serve(fetch, ino, generation, offset, buffer.len(), size)? {
            Some(bytes) => buffer.copy_from_slice(bytes),
            None => fetch.read_into(offset, buffer)?,
        }
        Ok(())
    }

    /// The window holding all of `[offset, end)` of the inode.
    fn window_at(&self, ino: Ino, generation: u64, offset: u64, end: u64) -> Option<usize> {
        self.windows
            .iter()
            .position(|w| w.of(ino, generation) && offset >= w.start && end <= w.end())
    }

    /// Waits for a background fetch holding all of `[offset, end)` and keeps it as a window.
    /// A fetch that failed is forgotten (the caller reads the request itself: the error, if it
    /// is real, comes again).
    fn fetched<F: Fetch<Pending = P>>(
        &mut self,
        fetch: &mut F,
        ino: Ino,
        generation: u64,
        offset: u64,
        end: u64,
    ) -> Option<usize> {
        let index = self.fetches.iter().position(|f| {
            f.ino == ino
                && f.generation == generation
                && offset >= f.start
                && end <= f.start + f.length as u64
        })?;
        let flight = self.fetches.swap_remove(index);
        let bytes = fetch.finish(flight.pending).ok()?;
        Some(self.insert(ino, generation, flight.start, bytes))
    }

    /// The bytes to read from `offset` for a request ending at `end` that nothing held, in a
    /// file of `size` bytes: a window's worth when the read continues an earlier one of the
    /// same file (or starts it) and the window is longer than the request; `None` otherwise.
    fn window_length(
        &self,
        ino: Ino,
        generation: u64,
        offset: u64,
        end: u64,
        size: u64,
    ) -> Option<usize> {
        if self.failed.contains(&(ino, generation)) {
            return None;
        }
        let sequential = offset == 0
            || self.read_ends.contains(&(ino, generation, offset))
            || self
                .windows
                .iter()
                .any(|w| w.of(ino, generation) && w.start < offset && offset <= w.end());
        let available = usize::try_from(size.saturating_sub(offset)).unwrap_or(usize::MAX);
        let window = READAHEAD_BYTES.min(available);
        (sequential && window as u64 > end - offset).then_some(window)
    }

    /// Starts fetching the window from `start` unless the file ends there, a window or fetch
    /// of the inode already holds `start`, or the slot has its fill of fetches.
    fn prefetch<F: Fetch<Pending = P>>(
        &mut self,
        fetch: &mut F,
        ino: Ino,
        generation: u64,
        start: u64,
        size: u64,
    ) {
        let held = self.windows.iter().any(|w| w.of(ino, generation) && w.start == start)
            || self
                .fetches
                .iter()
                .any(|f| (f.ino, f.generation, f.start) == (ino, generation, start));
        if start >= size || held || self.fetches.len() >= READAHEAD_FETCHES_MAX {
            return;
        }
        let length = READAHEAD_BYTES.min(usize::try_from(size - start).unwrap_or(usize::MAX));
        let bytes = self.buffer(length);
        if let Some(pending) = fetch.start(start, bytes) {
            self.prefetches += 1;
            self.fetches.push(InFlight { ino, generation, start, length, pending });
        }
    }

    /// A zeroed buffer of `length` bytes, reusing a spare one.
    fn buffer(&mut self, length: usize) -> Vec<u8> {
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.clear();
        bytes.resize(length, 0);
        bytes
    }

    /// Remembers that a read of the inode that no window served ended at `end`.
    fn note_read(&mut self, ino: Ino, generation: u64, end: u64) {
        if self.read_ends.len() >= READ_ENDS_MAX {
            self.read_ends.remove(0);
        }
        self.read_ends.push((ino, generation, end));
    }

    /// Keeps `bytes`, read from `start` of the inode, as a window (replacing the least
    /// recently used one if the slot has its fill); its index.
    fn insert(&mut self, ino: Ino, generation: u64, start: u64, bytes: Vec<u8>) -> usize {
        if self.windows.len() >= READAHEAD_WINDOWS_MAX {
            let oldest = (0..self.windows.len())
                .min_by_key(|&i| self.windows[i].used)
                .expect("windows are full, so not empty");
            let old = self.windows.swap_remove(oldest).bytes;
            if self.spare.len() < SPARE_BUFFERS_MAX {
                self.spare.push(old);
            }
        }
        self.read_ends.retain(|&(i, g, _)| (i, g) != (ino, generation));
        self.windows.push(Window { ino, generation, start, bytes, used: self.reads });
        assert!(self.windows.len() <= READAHEAD_WINDOWS_MAX, "readahead windows are bounded");
        self.windows.len() - 1
    }

    /// Drops every window, background fetch and read end of the inode (it was written,
    /// zero-filled, opened or released). A dropped fetch's answer is ignored when it comes.
    pub fn invalidate(&mut self, ino: Ino) {
        self.windows.retain(|w| w.ino != ino);
        self.fetches.retain(|f| f.ino != ino);
        self.read_ends.retain(|&(i, _, _)| i != ino);
        self.failed.retain(|&(i, _)| i != ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(start: u64, length: usize) -> Vec<u8> {
        (0..length as u64).map(|i| ((start + i) % 251) as u8).collect()
    }

    /// "Servers" holding `pattern`, counting reads; background reads run at `finish`.
    #[derive(Default)]
    struct Servers {
        reads: usize,
        background: bool,
        fail_background: bool,
    }

    impl Fetch for Servers {
        type Pending = (u64, Vec<u8>);
        type Error = &'static str;
        fn read(&mut self, offset: u64, mut bytes: Vec<u8>) -> Result<Vec<u8>, &'static str> {
            self.reads += 1;
            let length = bytes.len();
            bytes.copy_from_slice(&pattern(offset, length));
            Ok(bytes)
        }
        fn read_into(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), &'static str> {
            self.reads += 1;
            buffer.copy_from_slice(&pattern(offset, buffer.len()));
            Ok(())
        }
        fn start(&mut self, offset: u64, bytes: Vec<u8>) -> Option<(u64, Vec<u8>)> {
            self.background.then_some((offset, bytes))
        }
        fn finish(&mut self, (offset, bytes): (u64, Vec<u8>)) -> Result<Vec<u8>, &'static str> {
            if self.fail_background {
                return Err("EIO");
            }
            self.read(offset, bytes)
        }
    }

    fn read(
        ahead: &mut ReadAhead<(u64, Vec<u8>)>,
        servers: &mut Servers,
        ino: Ino,
        offset: u64,
        length: usize,
        size: u64,
    ) {
        let mut buffer = vec![0u8; length];
        ahead.read_through(servers, ino, 1, offset, &mut buffer, size).unwrap();
        assert_eq!(buffer, pattern(offset, length), "read of {length} at {offset}");
    }

    const KIB128: usize = 128 << 10;
    const SIZE: u64 = 64 << 20;

    #[test]
    fn a_sequential_reader_reads_each_window_once_and_the_next_in_the_background() {
        for background in [false, true] {
            let mut ahead = ReadAhead::default();
            let mut servers = Servers { background, ..Servers::default() };
            for i in 0..(SIZE / KIB128 as u64) {
                read(&mut ahead, &mut servers, 7, i * KIB128 as u64, KIB128, SIZE);
            }
            let windows = (SIZE / READAHEAD_BYTES as u64) as usize;
            assert_eq!(servers.reads, windows, "background {background}");
            if background {
                // Only the first window is read while the reader waits.
                assert_eq!((ahead.fills, ahead.prefetches), (1, windows as u64 - 1));
            } else {
                assert_eq!((ahead.fills, ahead.prefetches), (windows as u64, 0));
            }
            assert!(ahead.windows.len() <= READAHEAD_WINDOWS_MAX);
            assert!(ahead.fetches.len() <= READAHEAD_FETCHES_MAX);
        }
    }

    #[test]
    fn four_readers_of_one_file_keep_a_window_each() {
        let mut ahead = ReadAhead::default();
        let mut servers = Servers { background: true, ..Servers::default() };
        let region = 16u64 << 20;
        // Interleaved like IOR's readers of a shared file, each starting mid-file: the first
        // request of a region is a plain read, the next starts a window.
        for step in 0..(region / KIB128 as u64) {
            for reader in 0..4 {
                let offset = reader * region + step * KIB128 as u64;
                read(&mut ahead, &mut servers, 3, offset, KIB128, 4 * region);
            }
        }
        // Reader 0 starts the file, so windows from its first request; readers 1-3 one plain
        // read, then windows over the rest of their region (the last reaching into the next
        // region, or the end of the file).
        let first = region.div_ceil(READAHEAD_BYTES as u64);
        let others = 1 + (region - KIB128 as u64).div_ceil(READAHEAD_BYTES as u64);
        let wanted = (first + 3 * others) as usize;
        // Each reader's last background fetch may be left unread.
        assert!(
            (wanted..=wanted + 3).contains(&servers.reads) && ahead.fills == 4,
            "{} server reads, {} fills",
            servers.reads,
            ahead.fills
        );
    }

    #[test]
    fn random_reads_fetch_no_more_than_asked_and_windows_stop_at_the_size() {
        let ahead = ReadAhead::<()>::default();
        let at = 5u64 << 20;
        assert_eq!(ahead.window_length(1, 1, at, at + 4096, SIZE), None);
        let mut ahead = ahead;
        ahead.note_read(1, 1, at + 4096);
        assert_eq!(ahead.window_length(1, 1, at + 4096, at + 8192, SIZE), Some(READAHEAD_BYTES));
        // Another generation or inode is not the same reader.
        assert_eq!(ahead.window_length(1, 2, at + 4096, at + 8192, SIZE), None);
        assert_eq!(ahead.window_length(2, 1, at + 4096, at + 8192, SIZE), None);
        // A small file is read whole, never past its size; a request as long as the rest of
        // the file needs no window.
        assert_eq!(ahead.window_length(1, 1, 0, 4096, 10_000), Some(10_000));
        assert_eq!(ahead.window_length(1, 1, 0, 10_000, 10_000), None);
        assert_eq!(ahead.window_length(1, 1, 0, 4096, 0), None);
        // A small file read whole starts no background fetch past its end.
        let mut ahead = ReadAhead::default();
        let mut servers = Servers { background: true, ..Servers::default() };
        read(&mut ahead, &mut servers, 4, 0, 4096, 10_000);
        read(&mut ahead, &mut servers, 4, 4096, 5904, 10_000);
        assert_eq!((servers.reads, ahead.prefetches, ahead.fetches.len()), (1, 0, 0));
    }

    #[test]
    fn a_write_or_open_drops_the_inodes_windows_and_fetches_and_a_failed_fetch_is_read_again() {
        let mut ahead = ReadAhead::default();
        let mut servers = Servers { background: true, ..Servers::default() };
        read(&mut ahead, &mut servers, 9, 0, KIB128, SIZE);
        assert_eq!((ahead.windows.len(), ahead.fetches.len()), (1, 1));
        ahead.invalidate(9);
        assert_eq!((ahead.windows.len(), ahead.fetches.len()), (0, 0));
        // Not sequential any more (nothing remembered): a plain read.
        read(&mut ahead, &mut servers, 9, KIB128 as u64, KIB128, SIZE);
        assert_eq!(servers.reads, 2);
        // A background fetch that fails: the request is read again, correctly.
        let mut ahead = ReadAhead::default();
        read(&mut ahead, &mut servers, 9, 0, KIB128, SIZE);
        servers.fail_background = true;
        read(&mut ahead, &mut servers, 9, READAHEAD_BYTES as u64, KIB128, SIZE);
        // A failed read keeps nothing.
        let mut failing = ReadAhead::<()>::default();
        struct Broken;
        impl Fetch for Broken {
            type Pending = ();
            type Error = &'static str;
            fn read(&mut self, _: u64, _: Vec<u8>) -> Result<Vec<u8>, &'static str> {
                Err("EIO")
            }
            fn read_into(&mut self, _: u64, _: &mut [u8]) -> Result<(), &'static str> {
                Err("EIO")
            }
            fn start(&mut self, _: u64, _: Vec<u8>) -> Option<()> {
                None
            }
            fn finish(&mut self, (): ()) -> Result<Vec<u8>, &'static str> {
                Err("EIO")
            }
        }
        let mut buffer = vec![0u8; KIB128];
        assert_eq!(failing.read_through(&mut Broken, 9, 1, 0, &mut buffer, SIZE), Err("EIO"));
        assert!(failing.windows.is_empty());
        // ... and the file gets no more windows (each request alone) until it is opened again.
        assert_eq!(failing.window_length(9, 1, 0, 4096, SIZE), None);
        failing.invalidate(9);
        assert_eq!(failing.window_length(9, 1, 0, 4096, SIZE), Some(READAHEAD_BYTES));
        // Windows are bounded; the least recently used goes.
        let mut servers = Servers::default();
        for ino in 0..(READAHEAD_WINDOWS_MAX as u64 + 2) {
            read(&mut ahead, &mut servers, 100 + ino, 0, KIB128, SIZE);
        }
        assert_eq!(ahead.windows.len(), READAHEAD_WINDOWS_MAX);
        assert!(ahead.window_at(100, 1, 0, 1).is_none(), "the oldest window was replaced");
    }
}
