//! The storage seam: everything the store asks of the SSD directory.
//!
//! Small on purpose (after redb's `StorageBackend`): a directory of named files with positional
//! reads and writes, `sync`, `set_len` and `remove`. [`PosixStorage`] is the real one;
//! [`SimStorage`] keeps files in memory, remembers what was fsync'd, and can produce the image a
//! power loss would leave (unsynced writes dropped, the last write torn) for crash tests.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One segment file.
#[allow(clippy::len_without_is_empty)]
pub trait SegmentFile: Send + Sync {
    /// Writes all of `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// The alignment (of offset, length and memory address) that [`Self::write_direct_at`]
    /// needs, when this file can be written around the page cache; `None`: it cannot.
    fn direct_alignment(&self) -> Option<u64> {
        None
    }
    /// Writes all of `data` at `offset` around the page cache (`O_DIRECT`): no copy into the
    /// cache, no dirty pages for the kernel to track and write back, and the bytes are on the
    /// device (not yet durable: `sync` still makes them so) when it returns. `offset`,
    /// `data.len()` and `data`'s address must be multiples of `direct_alignment()`.
    fn write_direct_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(offset, data)
    }
    /// Fills all of `buf` from `offset`; reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Fills `first` from `offset` and `second` right after it (a record's header and
    /// payload). The default is two reads; POSIX files do it in one `preadv`.
    fn read_two_at(&self, offset: u64, first: &mut [u8], second: &mut [u8]) -> io::Result<()> {
        self.read_at(offset, first)?;
        self.read_at(offset + first.len() as u64, second)
    }
    /// Makes every completed write durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, length: u64) -> io::Result<()>;
    /// Starts writeback of a range without waiting (Linux `sync_file_range(WRITE)`), so a
    /// later `sync` has less left to do. A hint: the default does nothing.
    fn start_writeback(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
    /// Asks the kernel to drop the range's clean pages from its page cache (Linux
    /// `posix_fadvise(DONTNEED)`, which also starts writeback of dirty ones; those stay cached).
    /// A hint: the default does nothing.
    fn drop_cached(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
    /// Sets the Linux write-lifetime hint (`RWH_WRITE_LIFE_*`). `Ok(false)` when the kernel or
    /// file system does not support hints; that is not an error.
    fn set_write_hint(&self, hint: u64) -> io::Result<bool>;
    /// Reserves disk blocks for bytes `0..length` without changing the file's length
    /// (`fallocate(FALLOC_FL_KEEP_SIZE)`), so appends below `length` cannot run out of space.
    /// `Ok(false)` when the file system cannot; ENOSPC when the space is not there.
    fn preallocate(&self, _length: u64) -> io::Result<bool> {
        Ok(false)
    }
}

/// Whether `data` at `offset` meets `O_DIRECT`'s rules for `alignment`: offset, length and
/// memory address all multiples of it.
pub fn is_direct_aligned(offset: u64, data: &[u8], alignment: u64) -> bool {
    offset.is_multiple_of(alignment)
        && (data.len() as u64).is_multiple_of(alignment)
        && (data.as_ptr() as u64).is_multiple_of(alignment)
}

/// Whether an I/O error means the file system (or the user's disk quota) is full: the store
/// reports it as out of space and carries on, unlike other I/O errors.
pub fn is_no_space(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// A directory of segment files.
pub trait Storage: Send + Sync {
    /// Names of all files in the directory.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Creates a new empty file; fails if it exists.
    fn create(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>>;
    fn open(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes creations and removals durable (fsync of the directory).
    fn sync_directory(&self) -> io::Result<()>;
    /// Where the files live, for error messages.
    fn describe(&self) -> String;
    /// Bytes this process can still allocate in the directory's file system (`statvfs`
    /// f_bavail, or f_bfree for root, × f_frsize); `None` when unknown.
    fn available_bytes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
}

/// The real thing: files in a directory, `pwrite`/`pread`/`fdatasync`.
///
/// Holds an exclusive `flock` on `<directory>/LOCK` for its lifetime, so two servers can never
/// append to the same log (the kernel drops the lock when the process dies, even by SIGKILL).
pub struct PosixStorage {
    directory: PathBuf,
    _lock: File,
    /// Open every segment a second time with `O_DIRECT` for [`SegmentFile::write_direct_at`].
    direct_io: bool,
}

/// Alignment asked of `O_DIRECT` writes: a 4 KiB page covers the logical block size of every
/// SSD and file system the store runs on (512 B or 4 KiB).
pub const DIRECT_ALIGNMENT_BYTES: u64 = 4096;

/// Name of the lock file in the SSD directory (not a segment; recovery ignores it).
pub const LOCK_FILE_NAME: &str = "LOCK";

impl PosixStorage {
    /// Uses `directory`, creating it if needed, and locks it. Fails with `WouldBlock` naming the
    /// directory if another store holds it.
    pub fn new(directory: &Path) -> io::Result<PosixStorage> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(directory)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(directory.join(LOCK_FILE_NAME))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(io::Error::new(
                error.kind(),
                format!(
                    "{} is in use by another store (flock on {LOCK_FILE_NAME}: {error})",
                    directory.display()
                ),
            ));
        }
        Ok(PosixStorage { directory: directory.to_path_buf(), _lock: lock, direct_io: false })
    }

    /// Also opens each segment with `O_DIRECT` for the spill's aligned writes, where the file
    /// system allows it (tmpfs and some FUSE file systems refuse; those segments stay buffered).
    pub fn with_direct_io(mut self, direct_io: bool) -> PosixStorage {
        self.direct_io = direct_io;
        self
    }

    /// The segment at `path` (opened or created by `options`), with its `O_DIRECT` twin when
    /// the storage asks for one and the file system gives it.
    fn segment(&self, path: &Path, options: &OpenOptions) -> io::Result<Arc<dyn SegmentFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = options.open(path)?;
        let direct = if self.direct_io {
            match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
                Ok(direct) => Some(direct),
                // Not supported here: the buffered descriptor does every write.
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => None,
                Err(error) => return Err(error),
            }
        } else {
            None
        };
        Ok(Arc::new(PosixFile { file, direct }))
    }
}

struct PosixFile {
    file: File,
    /// The same file opened with `O_DIRECT` (writes only), when the file system allows it.
    direct: Option<File>,
}

impl SegmentFile for PosixFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }
    fn direct_alignment(&self) -> Option<u64> {
        self.direct.as_ref().map(|_| DIRECT_ALIGNMENT_BYTES)
    }
    fn write_direct_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let Some(direct) = &self.direct else { return self.write_at(offset, data) };
        debug_assert!(is_direct_aligned(offset, data, DIRECT_ALIGNMENT_BYTES));
        let mut done = 0;
        while done < data.len() {
            match direct.write_at(&data[done..], offset + done as u64) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                // A short direct write (the disk filled midway) leaves an unaligned rest
                // only if the kernel stopped inside a block; finish it through the cache.
                Ok(n) if !((done + n) as u64).is_multiple_of(DIRECT_ALIGNMENT_BYTES) => {
                    return self.file.write_all_at(&data[done + n..], offset + (done + n) as u64);
                }
                Ok(n) => done += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn read_two_at(&self, offset: u64, first: &mut [u8], second: &mut [u8]) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let wanted = first.len() + second.len();
        let iov = [
            libc::iovec { iov_base: first.as_mut_ptr().cast(), iov_len: first.len() },
            libc::iovec { iov_base: second.as_mut_ptr().cast(), iov_len: second.len() },
        ];
        // SAFETY: both iovecs describe live, exclusively borrowed buffers of the given lengths.
        let n =
            unsafe { libc::preadv(self.file.as_raw_fd(), iov.as_ptr(), 2, offset as libc::off_t) };
        match n {
            n if n < 0 => Err(io::Error::last_os_error()),
            n if n as usize == wanted => Ok(()),
            // Short (a signal, or the end of the file): finish with plain reads, which report EOF.
            n => {
                let n = n as usize;
                if n < first.len() {
                    self.file.read_exact_at(&mut first[n..], offset + n as u64)?;
                    self.file.read_exact_at(second, offset + first.len() as u64)
                } else {
                    let done = n - first.len();
                    self.file.read_exact_at(&mut second[done..], offset + n as u64)
                }
            }
        }
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, length: u64) -> io::Result<()> {
        self.file.set_len(length)
    }
    fn start_writeback(&self, offset: u64, length: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on our own descriptor.
        let result = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                length as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    fn drop_cached(&self, offset: u64, length: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on our own descriptor.
        let result = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                length as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        // posix_fadvise returns the error number instead of setting errno.
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(result))
        }
    }
    fn set_write_hint(&self, hint: u64) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        // F_LINUX_SPECIFIC_BASE (1024) + 12; not every libc version exports the name.
        const F_SET_RW_HINT: libc::c_int = 1024 + 12;
        let value: u64 = hint;
        // SAFETY: fcntl with F_SET_RW_HINT reads one u64 through the pointer, which is valid
        // for the duration of the call.
        let result =
            unsafe { libc::fcntl(self.file.as_raw_fd(), F_SET_RW_HINT, &value as *const u64) };
        if result == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(false),
            _ => Err(error),
        }
    }
    fn preallocate(&self, length: u64) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on our own descriptor.
        let result = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                0,
                length as libc::off_t,
            )
        };
        if result == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(false),
            _ => Err(error),
        }
    }
}

impl Storage for PosixStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.directory)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>> {
        self.segment(
            &self.directory.join(name),
            OpenOptions::new().read(true).write(true).create_new(true),
        )
    }
    fn open(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>> {
        self.segment(&self.directory.join(name), OpenOptions::new().read(true).write(true))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.directory.join(name))
    }
    fn sync_directory(&self) -> io::Result<()> {
        File::open(&self.directory)?.sync_all()
    }
    fn describe(&self) -> String {
        self.directory.display().to_string()
    }
    fn available_bytes(&self) -> io::Result<Option<u64>> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.directory.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in directory name"))?;
        // SAFETY: statvfs is plain old data, for which all-zero bytes are a valid value.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the path is a valid C string and `stats` a live, exclusively borrowed struct.
        if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Root may also use the blocks the file system keeps back for it (ext4's reserved
        // blocks): counting only f_bavail would keep a root server refusing writes long after
        // a delete freed space it can use.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let blocks = if unsafe { libc::geteuid() } == 0 { stats.f_bfree } else { stats.f_bavail };
        Ok(Some((blocks as u64).saturating_mul(stats.f_frsize as u64)))
    }
}

/// In-memory storage that knows what a power loss would keep.
///
/// Each file has its `current` bytes and its `durable` bytes (as of its last `sync`). A file's
/// existence is durable once `sync_directory` ran after its creation; a removal likewise.
/// [`SimStorage::crash_image`] builds the directory a power loss would leave behind.
#[derive(Default)]
pub struct SimStorage {
    state: Mutex<SimState>,
    /// Global write counter, so the crash image can find the most recent write.
    clock: Arc<AtomicU64>,
    /// The simulated file system's size and the faults queued for injection.
    limits: Arc<Mutex<SimLimits>>,
}

/// An operation a fault can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// `write_at` of any file.
    Write,
    /// `sync` (fdatasync) of any file.
    Sync,
    /// `create` of a file.
    Create,
}

/// A fault queued with [`SimStorage::inject`]: the `skip + 1`-th next `op` fails with `errno`.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub op: FaultOp,
    pub skip: u64,
    pub errno: i32,
    /// For a `Write`: how many of its bytes land before it fails (a short, torn write).
    pub written_bytes: u64,
}

#[derive(Default)]
struct SimLimits {
    /// Bytes the file system holds; `None`: unlimited.
    capacity_bytes: Option<u64>,
    /// Bytes allocated over all files (each file's max of its length and its preallocation).
    allocated_bytes: u64,
    faults: Vec<Fault>,
    /// What `direct_alignment` answers (`SimStorage::set_direct_alignment`).
    direct_alignment: Option<u64>,
    /// Bytes written by `write_direct_at`, for tests that must see the direct path taken.
    direct_bytes_written: u64,
}

impl SimLimits {
    /// The fault that fires for this `op` now, if any (counting down the others of that op).
    fn take_fault(&mut self, op: FaultOp) -> Option<Fault> {
        let mut fired = None;
        self.faults.retain_mut(|fault| {
            if fault.op != op || fired.is_some() {
                return true;
            }
            if fault.skip == 0 {
                fired = Some(*fault);
                false
            } else {
                fault.skip -= 1;
                true
            }
        });
        fired
    }

    /// Grows the allocation by `bytes`, or says how many fit (ENOSPC for the rest).
    fn allocate(&mut self, bytes: u64) -> Result<(), u64> {
        match self.capacity_bytes {
            Some(capacity) if self.allocated_bytes + bytes > capacity => {
                Err(capacity.saturating_sub(self.allocated_bytes))
            }
            _ => {
                self.allocated_bytes += bytes;
                Ok(())
            }
        }
    }
}

fn errno_error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

#[derive(Default)]
struct SimState {
    /// Files visible now.
    files: BTreeMap<String, Arc<SimFile>>,
    /// Files whose existence survives a crash (removed ones stay until the removal is synced).
    durable_names: BTreeMap<String, Arc<SimFile>>,
}

/// One simulated file.
pub struct SimFile {
    inner: Mutex<SimFileState>,
    clock: Arc<AtomicU64>,
    limits: Arc<Mutex<SimLimits>>,
}

#[derive(Clone, Default)]
struct SimFileState {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Bytes reserved by `preallocate` (the file's allocation is the larger of this and its
    /// length).
    preallocated: u64,
    /// Writes since the last sync: (clock, offset, data).
    unsynced: Vec<(u64, u64, Vec<u8>)>,
}

/// What a simulated power loss does with writes that were not fsync'd.
#[derive(Clone, Copy, Debug)]
pub struct CrashPlan {
    /// Keep a prefix of this many bytes of the most recent unsynced write (a torn write);
    /// `None` drops it like the others.
    pub torn_write_bytes: Option<u64>,
    /// Keep every unsynced write except the most recent one (a kinder disk); false drops them.
    pub keep_older_unsynced: bool,
}

impl SimStorage {
    pub fn new() -> Arc<SimStorage> {
        Arc::new(SimStorage::default())
    }

    /// The directory as a power loss at this instant would leave it, as a fresh storage.
    pub fn crash_image(&self, plan: CrashPlan) -> Arc<SimStorage> {
        let state = self.state.lock();
        let latest = state
            .durable_names
            .values()
            .filter_map(|file| file.inner.lock().unsynced.last().map(|(clock, _, _)| *clock))
            .max();
        let image = SimStorage::new();
        {
            let mut image_state = image.state.lock();
            for (name, file) in &state.durable_names {
                let inner = file.inner.lock();
                let mut bytes = inner.durable.clone();
                for (clock, offset, data) in &inner.unsynced {
                    let keep = if Some(*clock) == latest {
                        plan.torn_write_bytes.map(|n| (n as usize).min(data.len()))
                    } else if plan.keep_older_unsynced {
                        Some(data.len())
                    } else {
                        None
                    };
                    if let Some(keep) = keep {
                        let end = *offset as usize + keep;
                        if bytes.len() < end {
                            bytes.resize(end, 0);
                        }
                        bytes[*offset as usize..end].copy_from_slice(&data[..keep]);
                    }
                }
                let file = image.new_file(bytes);
                image_state.files.insert(name.clone(), file.clone());
                image_state.durable_names.insert(name.clone(), file);
            }
        }
        image
    }

    /// Flips one bit of a file, now and durably (bad media, for tests).
    pub fn corrupt(&self, name: &str, offset: u64) {
        let state = self.state.lock();
        let file = state.files.get(name).expect("corrupt: no such file");
        let mut inner = file.inner.lock();
        inner.current[offset as usize] ^= 0x40;
        if (offset as usize) < inner.durable.len() {
            inner.durable[offset as usize] ^= 0x40;
        }
    }

    /// Sets the simulated file system's size (`None`: unlimited). Files already there keep
    /// their bytes even when they exceed it.
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        self.limits.lock().capacity_bytes = capacity_bytes;
    }

    /// Lets every file take `O_DIRECT`-style writes aligned to `alignment` (`None`: none).
    /// A misaligned direct write fails with EINVAL, as the kernel's would.
    pub fn set_direct_alignment(&self, alignment: Option<u64>) {
        self.limits.lock().direct_alignment = alignment;
    }

    /// Bytes written so far through `write_direct_at`.
    pub fn direct_bytes_written(&self) -> u64 {
        self.limits.lock().direct_bytes_written
    }

    /// Bytes allocated on the simulated file system now (`set_capacity` to this fills it).
    pub fn allocated_bytes(&self) -> u64 {
        self.limits.lock().allocated_bytes
    }

    /// Queues a fault: the `fault.skip + 1`-th next `fault.op` fails with `fault.errno`.
    pub fn inject(&self, fault: Fault) {
        self.limits.lock().faults.push(fault);
    }

    /// Faults queued and not fired yet.
    pub fn pending_faults(&self) -> usize {
        self.limits.lock().faults.len()
    }

    /// Names and current lengths of all files, for tests.
    pub fn files(&self) -> Vec<(String, u64)> {
        let state = self.state.lock();
        state.files.iter().map(|(n, f)| (n.clone(), f.inner.lock().current.len() as u64)).collect()
    }

    fn new_file(&self, bytes: Vec<u8>) -> Arc<SimFile> {
        self.limits.lock().allocated_bytes += bytes.len() as u64;
        Arc::new(SimFile {
            inner: Mutex::new(SimFileState {
                current: bytes.clone(),
                durable: bytes,
                unsynced: Vec::new(),
                preallocated: 0,
            }),
            clock: self.clock.clone(),
            limits: self.limits.clone(),
        })
    }
}

impl SegmentFile for SimFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let clock = self.clock.fetch_add(1, Ordering::SeqCst) + 1;
        let mut inner = self.inner.lock();
        let mut limits = self.limits.lock();
        // A fault, or a write past the file system's size, lands a prefix and then fails, the
        // way a short pwrite followed by an error does.
        let mut failure = limits.take_fault(FaultOp::Write).map(|fault| {
            (fault.written_bytes.min(data.len() as u64) as usize, errno_error(fault.errno))
        });
        let allocated = (inner.current.len() as u64).max(inner.preallocated);
        let end = offset + data.len() as u64;
        if failure.is_none() && end > allocated {
            if let Err(fits) = limits.allocate(end - allocated) {
                let landed = (allocated + fits).saturating_sub(offset).min(data.len() as u64);
                limits.allocate(fits).expect("the bytes that fit are free");
                failure = Some((landed as usize, errno_error(libc::ENOSPC)));
            }
        }
        drop(limits);
        let (data, failure) = match failure {
            Some((landed, error)) => (&data[..landed], Some(error)),
            None => (data, None),
        };
        let end = offset as usize + data.len();
        if inner.current.len() < end {
            inner.current.resize(end, 0);
        }
        inner.current[offset as usize..end].copy_from_slice(data);
        inner.unsynced.push((clock, offset, data.to_vec()));
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
    fn direct_alignment(&self) -> Option<u64> {
        self.limits.lock().direct_alignment
    }
    fn write_direct_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        {
            let mut limits = self.limits.lock();
            match limits.direct_alignment {
                Some(alignment) if is_direct_aligned(offset, data, alignment) => {
                    limits.direct_bytes_written += data.len() as u64;
                }
                _ => return Err(errno_error(libc::EINVAL)),
            }
        }
        // Same faults, space and crash rules as any write: a direct write is not durable
        // before `sync` either, and a power loss can tear it.
        self.write_at(offset, data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let inner = self.inner.lock();
        let end = offset as usize + buf.len();
        if end > inner.current.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past end of file"));
        }
        buf.copy_from_slice(&inner.current[offset as usize..end]);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        if let Some(fault) = self.limits.lock().take_fault(FaultOp::Sync) {
            // Like Linux after a failed writeback: the dirty pages are marked clean and the
            // error is reported once, so a later fsync succeeds without making them durable.
            inner.unsynced.clear();
            return Err(errno_error(fault.errno));
        }
        inner.durable = inner.current.clone();
        inner.unsynced.clear();
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.lock().current.len() as u64)
    }
    fn set_len(&self, length: u64) -> io::Result<()> {
        // The store truncates during recovery and when it cuts a failed append, and syncs
        // right after; model it as durable.
        let mut inner = self.inner.lock();
        let before = (inner.current.len() as u64).max(inner.preallocated);
        let after = length.max(inner.preallocated);
        {
            let mut limits = self.limits.lock();
            if after > before {
                limits.allocate(after - before).map_err(|_| errno_error(libc::ENOSPC))?;
            } else {
                limits.allocated_bytes -= before - after;
            }
        }
        inner.current.resize(length as usize, 0);
        inner.durable.resize(length as usize, 0);
        inner.unsynced.retain(|(_, offset, _)| *offset < length);
        Ok(())
    }
    fn set_write_hint(&self, _hint: u64) -> io::Result<bool> {
        Ok(false)
    }
    fn preallocate(&self, length: u64) -> io::Result<bool> {
        let mut inner = self.inner.lock();
        let allocated = (inner.current.len() as u64).max(inner.preallocated);
        if length > allocated {
            self.limits
                .lock()
                .allocate(length - allocated)
                .map_err(|_| errno_error(libc::ENOSPC))?;
            inner.preallocated = length;
        }
        Ok(true)
    }
}

impl SimFile {
    /// Bytes this file holds on the simulated file system.
    fn allocated_bytes(&self) -> u64 {
        let inner = self.inner.lock();
        (inner.current.len() as u64).max(inner.preallocated)
    }
}

impl Storage for SimStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.state.lock().files.keys().cloned().collect())
    }
    fn create(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>> {
        let mut state = self.state.lock();
        if state.files.contains_key(name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{name} exists")));
        }
        {
            let mut limits = self.limits.lock();
            if let Some(fault) = limits.take_fault(FaultOp::Create) {
                return Err(errno_error(fault.errno));
            }
            // A new file needs an inode; a full file system has none to give.
            if limits.capacity_bytes.is_some_and(|c| limits.allocated_bytes >= c) {
                return Err(errno_error(libc::ENOSPC));
            }
        }
        let file = self.new_file(Vec::new());
        state.files.insert(name.to_string(), file.clone());
        Ok(file)
    }
    fn open(&self, name: &str) -> io::Result<Arc<dyn SegmentFile>> {
        let state = self.state.lock();
        let file =
            state.files.get(name).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{name} not found"))
            })?;
        Ok(file)
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        let file = state
            .files
            .remove(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} not found")))?;
        // Its blocks are free once no name holds it (the durable name is only the crash image).
        let freed = file.allocated_bytes();
        let mut limits = self.limits.lock();
        limits.allocated_bytes = limits.allocated_bytes.saturating_sub(freed);
        Ok(())
    }
    fn sync_directory(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        state.durable_names = state.files.clone();
        Ok(())
    }
    fn describe(&self) -> String {
        "simulated storage".to_string()
    }
    fn available_bytes(&self) -> io::Result<Option<u64>> {
        let limits = self.limits.lock();
        Ok(limits.capacity_bytes.map(|c| c.saturating_sub(limits.allocated_bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_preallocation_keeps_the_length_and_free_space_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let storage = PosixStorage::new(dir.path()).unwrap();
        let before = storage.available_bytes().unwrap().expect("statvfs works on a tempdir");
        let file = storage.create("a").unwrap();
        file.write_at(0, b"header").unwrap();
        if file.preallocate(4 << 20).unwrap() {
            // Reserved, not written: the length is still the logical end.
            assert_eq!(file.len().unwrap(), 6);
            let after = storage.available_bytes().unwrap().unwrap();
            assert!(after < before, "4 MiB preallocated but free space did not shrink");
        }
    }

    #[test]
    fn sim_storage_runs_out_of_space_with_a_short_write_and_frees_on_remove() {
        let storage = SimStorage::new();
        storage.set_capacity(Some(100));
        let dir: Arc<dyn Storage> = storage.clone();
        let file = dir.create("a").unwrap();
        let error = file.write_at(0, &[1u8; 150]).unwrap_err();
        assert!(is_no_space(&error));
        // The first 100 bytes landed (a short write), the rest did not.
        assert_eq!(file.len().unwrap(), 100);
        assert_eq!(dir.available_bytes().unwrap(), Some(0));
        assert!(is_no_space(&dir.create("b").err().unwrap()));
        dir.remove("a").unwrap();
        assert_eq!(dir.available_bytes().unwrap(), Some(100));
    }

    #[test]
    fn crash_image_drops_unsynced_and_tears_last_write() {
        let storage = SimStorage::new();
        let dir: Arc<dyn Storage> = storage.clone();
        let file = dir.create("a").unwrap();
        dir.sync_directory().unwrap();
        file.write_at(0, b"durable!").unwrap();
        file.sync().unwrap();
        file.write_at(8, b"lost").unwrap();
        file.write_at(12, b"torn-write").unwrap();
        let image = storage
            .crash_image(CrashPlan { torn_write_bytes: Some(3), keep_older_unsynced: false });
        let image_dir: Arc<dyn Storage> = image;
        let reopened = image_dir.open("a").unwrap();
        assert_eq!(reopened.len().unwrap(), 15);
        let mut buf = vec![0u8; 15];
        reopened.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"durable!\0\0\0\0tor");
        // A file never made durable in the directory vanishes.
        dir.create("b").unwrap();
        let image =
            storage.crash_image(CrashPlan { torn_write_bytes: None, keep_older_unsynced: true });
        assert_eq!(image.list().unwrap(), vec!["a".to_string()]);
    }
}
