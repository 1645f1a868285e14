//! Spilled records written around the page cache.
//!
//! On the `ssd` path every byte used to be copied into the page cache, tracked dirty, written
//! back by a kernel thread and dropped again when its segment died: on the 2-core machines the
//! store was measured on, that cost more CPU than the network receive (docs/design/log-format.md,
//! "The spill's write path"). A spill run is contiguous in the segment, so all its whole 4 KiB
//! blocks go out with `O_DIRECT` through a small aligned bounce buffer (the DRAM ring is not laid
//! out at the segment's alignment), and only the partial blocks at either end, which a
//! neighbouring run shares, go through the page cache. Both halves still need `sync` to be
//! durable, so the commit protocol and the crash rules do not change.

use crate::storage::{is_direct_aligned, SegmentFile};
use parking_lot::Mutex;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one bounce buffer: one `O_DIRECT` write at most. A direct write waits for the
/// device, so it must be large for the device to see several requests at once (measured with
/// `dd oflag=direct` here: 1 MiB writes 375–520 MB/s, 16 MiB 670 MB/s); a spill run is at most
/// `store.flusher_batch_bytes` (8 MiB by default), so one run is one write.
pub(crate) const BOUNCE_BUFFER_BYTES: usize = 8 << 20;
/// Bounce buffers kept between spills (the flusher and a few committers spill at once); more
/// concurrent spills allocate one for the time of their write.
const BOUNCE_BUFFERS_KEPT_MAX: usize = 4;

/// A zeroed heap buffer whose address is a multiple of its alignment.
struct AlignedBuffer {
    pointer: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively; moving it moves that ownership.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    fn new(bytes: usize, alignment: usize) -> AlignedBuffer {
        let layout = Layout::from_size_align(bytes, alignment).expect("bounce buffer layout");
        // SAFETY: the layout has a non-zero size (asserted by the callers' constants).
        let raw = unsafe { alloc_zeroed(layout) };
        let pointer = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuffer { pointer, layout }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `layout.size()` initialised (zeroed) bytes that only this
        // value reaches, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout and not freed before.
        unsafe { dealloc(self.pointer.as_ptr(), self.layout) };
    }
}

/// The spill's direct writer: its bounce buffers and what it wrote.
#[derive(Default)]
pub(crate) struct DirectWriter {
    /// Buffers kept for the next spill, by alignment.
    kept: Mutex<Vec<(u64, AlignedBuffer)>>,
    /// Bytes written with `O_DIRECT` (`StoreStats::ssd_direct_bytes_written`).
    direct_bytes: AtomicU64,
}

impl DirectWriter {
    /// Writes `bytes` at `offset` of `file`: its whole aligned blocks around the page cache when
    /// the file can take that, the partial blocks at either end (and everything on a file that
    /// cannot) through it. All of it or an error; a failure may leave any part written, as a
    /// failed `pwrite` may.
    pub(crate) fn write(
        &self,
        file: &dyn SegmentFile,
        offset: u64,
        bytes: &[u8],
    ) -> io::Result<()> {
        let Some(alignment) = file.direct_alignment() else {
            return file.write_at(offset, bytes);
        };
        let end = offset + bytes.len() as u64;
        let middle_start = offset.next_multiple_of(alignment);
        let middle_end = end / alignment * alignment;
        if middle_end <= middle_start {
            return file.write_at(offset, bytes);
        }
        let at = |position: u64| (position - offset) as usize;
        // Head first, then the middle, then the tail: the log's order, which a torn power loss
        // keeps as a prefix more often (recovery handles any tearing either way).
        file.write_at(offset, &bytes[..at(middle_start)])?;
        self.write_middle(file, middle_start, &bytes[at(middle_start)..at(middle_end)], alignment)?;
        file.write_at(middle_end, &bytes[at(middle_end)..])
    }

    /// Writes whole aligned blocks with `write_direct_at`, a bounce buffer at a time.
    fn write_middle(
        &self,
        file: &dyn SegmentFile,
        offset: u64,
        bytes: &[u8],
        alignment: u64,
    ) -> io::Result<()> {
        debug_assert!(offset.is_multiple_of(alignment));
        debug_assert!((bytes.len() as u64).is_multiple_of(alignment));
        if is_direct_aligned(offset, bytes, alignment) {
            // Already aligned in memory too: no copy.
            file.write_direct_at(offset, bytes)?;
            self.direct_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return Ok(());
        }
        let mut buffer = self.take(alignment);
        let result = (|| {
            for (index, chunk) in bytes.chunks(BOUNCE_BUFFER_BYTES).enumerate() {
                let staged = &mut buffer.as_mut_slice()[..chunk.len()];
                staged.copy_from_slice(chunk);
                file.write_direct_at(offset + (index * BOUNCE_BUFFER_BYTES) as u64, staged)?;
                self.direct_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            Ok(())
        })();
        self.give_back(alignment, buffer);
        result
    }

    fn take(&self, alignment: u64) -> AlignedBuffer {
        let mut kept = self.kept.lock();
        match kept.iter().position(|(a, _)| *a == alignment) {
            Some(at) => kept.swap_remove(at).1,
            None => AlignedBuffer::new(BOUNCE_BUFFER_BYTES, alignment as usize),
        }
    }

    fn give_back(&self, alignment: u64, buffer: AlignedBuffer) {
        let mut kept = self.kept.lock();
        if kept.len() < BOUNCE_BUFFERS_KEPT_MAX {
            kept.push((alignment, buffer));
        }
    }

    /// Bytes written around the page cache so far.
    pub(crate) fn direct_bytes_written(&self) -> u64 {
        self.direct_bytes.load(Ordering::Relaxed)
    }
}

// The bounce buffer holds whole blocks of every alignment the storage asks for.
const _: () =
    assert!(BOUNCE_BUFFER_BYTES.is_multiple_of(crate::storage::DIRECT_ALIGNMENT_BYTES as usize));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{SimStorage, Storage};

    fn written(storage: &SimStorage, name: &str, length: usize) -> Vec<u8> {
        let file = storage.open(name).unwrap();
        let mut back = vec![0u8; length];
        file.read_at(0, &mut back).unwrap();
        back
    }

    #[test]
    fn runs_split_into_cached_edges_and_direct_blocks_and_read_back_whole() {
        let storage = SimStorage::new();
        storage.set_direct_alignment(Some(4096));
        let file = storage.create("segment").unwrap();
        let writer = DirectWriter::default();
        let bytes: Vec<u8> =
            (0..2 * BOUNCE_BUFFER_BYTES + 12_345).map(|i| (i % 251) as u8).collect();
        // Unaligned start and end, several bounce buffers in the middle.
        writer.write(file.as_ref(), 100, &bytes).unwrap();
        // A second run sharing the first one's last block.
        writer.write(file.as_ref(), 100 + bytes.len() as u64, &bytes[..5000]).unwrap();
        let back = written(&storage, "segment", 100 + bytes.len() + 5000);
        assert_eq!(&back[100..100 + bytes.len()], &bytes[..]);
        assert_eq!(&back[100 + bytes.len()..], &bytes[..5000]);
        let end = 100 + bytes.len() as u64;
        let expected_direct = end / 4096 * 4096 - 4096;
        assert_eq!(storage.direct_bytes_written(), expected_direct);
        assert_eq!(writer.direct_bytes_written(), expected_direct);
    }

    #[test]
    fn small_runs_and_files_without_direct_io_stay_in_the_page_cache() {
        let storage = SimStorage::new();
        let file = storage.create("segment").unwrap();
        let writer = DirectWriter::default();
        writer.write(file.as_ref(), 0, &vec![7u8; 3 * 4096]).unwrap();
        storage.set_direct_alignment(Some(4096));
        // Inside one block, and across one boundary without a whole block: nothing direct.
        writer.write(file.as_ref(), 3 * 4096 + 10, &[1u8; 100]).unwrap();
        writer.write(file.as_ref(), 4 * 4096 - 10, &[2u8; 4000]).unwrap();
        assert_eq!(storage.direct_bytes_written(), 0);
        let back = written(&storage, "segment", 4 * 4096 + 3990);
        assert!(back[..3 * 4096].iter().all(|b| *b == 7));
        assert!(back[3 * 4096 + 10..3 * 4096 + 110].iter().all(|b| *b == 1));
        assert!(back[4 * 4096 - 10..].iter().all(|b| *b == 2));
    }

    #[test]
    fn a_failed_direct_write_is_reported() {
        let storage = SimStorage::new();
        storage.set_direct_alignment(Some(4096));
        let file = storage.create("segment").unwrap();
        storage.inject(crate::storage::Fault {
            op: crate::storage::FaultOp::Write,
            skip: 1,
            errno: libc::EIO,
            written_bytes: 4096,
        });
        let error =
            DirectWriter::default().write(file.as_ref(), 10, &vec![3u8; 64 << 10]).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO));
    }
}
