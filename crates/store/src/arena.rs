//! The DRAM log: one ring buffer allocated (and optionally pre-faulted) at open.
//!
//! Positions are logical and only grow (`head` = next free byte, `tail` = oldest byte still
//! held); the physical place is `position % capacity`. A record never wraps: if it does not fit
//! before the end, the rest of the ring is skipped as padding. The store's state machine
//! guarantees that a byte range is written by exactly one thread (its reserver) before it is
//! published, and is neither written nor reused while anyone reads it; this type only does the
//! pointer arithmetic and checks bounds.

use std::cell::UnsafeCell;

/// The ring's memory. Shared by all threads; the byte ranges are handed out by [`Ring`].
pub struct Arena {
    bytes: Box<[UnsafeCell<u8>]>,
}

/// Asks for transparent huge pages over the ring (a hint; kernels set to `madvise` need it):
/// every ingested byte is copied into the ring, and 2 MiB pages spare the copies most TLB
/// misses and the prefault most page faults.
fn advise_huge_pages(bytes: &[UnsafeCell<u8>]) {
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    let start = bytes.as_ptr() as usize;
    let aligned_start = start.next_multiple_of(HUGE_PAGE_BYTES);
    let aligned_end = (start + bytes.len()) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if aligned_end > aligned_start {
        // SAFETY: the range lies inside our own allocation; MADV_HUGEPAGE changes no contents.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            )
        };
    }
}

/// The ring's bookkeeping, kept under the store lock.
#[derive(Debug)]
pub struct Ring {
    capacity: u64,
    head: u64,
    tail: u64,
}

// SAFETY: concurrent access goes to disjoint ranges as documented above; ranges are handed out
// and reclaimed only under the store lock.
unsafe impl Sync for Arena {}
// SAFETY: the arena owns its bytes (a boxed slice), so moving it to another thread is moving a Box.
unsafe impl Send for Arena {}

/// A reservation: `padding` bytes skipped before `position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub padding: u64,
    pub position: u64,
}

impl Arena {
    pub fn new(capacity: u64, prefault: bool) -> Arena {
        assert!(capacity > 0);
        // calloc-style allocation: pages are mapped lazily unless we touch them below.
        let zeroed: Box<[u8]> = vec![0u8; capacity as usize].into_boxed_slice();
        // SAFETY: UnsafeCell<u8> is repr(transparent) over u8, so the slice layouts agree.
        let bytes: Box<[UnsafeCell<u8>]> =
            unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [UnsafeCell<u8>]) };
        advise_huge_pages(&bytes);
        if prefault {
            let mut at = 0usize;
            while at < bytes.len() {
                // SAFETY: in bounds; nobody else can see the arena yet.
                unsafe { std::ptr::write_volatile(bytes[at].get(), 0) };
                at += 4096;
            }
        }
        Arena { bytes }
    }

    pub fn capacity(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// A mutable view of a reserved range.
    ///
    /// # Safety
    /// The caller must be the only one accessing `[position, position + length)` (it reserved
    /// it and has not published it yet).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, position: u64, length: u64) -> &mut [u8] {
        // SAFETY: `physical` asserts the range is inside the arena; the caller guarantees that
        // nobody else accesses it while the view lives.
        unsafe {
            let start = self.physical(position, length);
            std::slice::from_raw_parts_mut(self.bytes[start].get(), length as usize)
        }
    }

    /// A shared view of a published range.
    ///
    /// # Safety
    /// Nobody may write `[position, position + length)` while the view lives (the range is
    /// published and not yet released).
    pub unsafe fn slice(&self, position: u64, length: u64) -> &[u8] {
        // SAFETY: `physical` asserts the range is inside the arena; the caller guarantees that
        // nobody writes it while the view lives.
        unsafe {
            let start = self.physical(position, length);
            std::slice::from_raw_parts(self.bytes[start].get() as *const u8, length as usize)
        }
    }

    fn physical(&self, position: u64, length: u64) -> usize {
        assert!(length > 0);
        let start = position % self.capacity();
        assert!(start + length <= self.capacity(), "range wraps the ring");
        start as usize
    }
}

impl Ring {
    pub fn new(capacity: u64) -> Ring {
        assert!(capacity > 0);
        Ring { capacity, head: 0, tail: 0 }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `[position, position + length)` is currently held.
    pub fn holds(&self, position: u64, length: u64) -> bool {
        position >= self.tail && position + length <= self.head
    }

    /// Bytes held (written, being written, or padding) between tail and head.
    pub fn used(&self) -> u64 {
        self.head - self.tail
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    /// Reserves `length` contiguous bytes, or `None` if the ring is too full right now.
    pub fn reserve(&mut self, length: u64) -> Option<Reservation> {
        assert!(length > 0 && length <= self.capacity(), "reservation of {length} bytes");
        let physical = self.head % self.capacity();
        let padding =
            if physical + length > self.capacity() { self.capacity() - physical } else { 0 };
        if self.used() + padding + length > self.capacity() {
            return None;
        }
        let position = self.head + padding;
        self.head = position + length;
        debug_assert!(self.used() <= self.capacity());
        Some(Reservation { padding, position })
    }

    /// Releases everything before `position` (the oldest held bytes).
    pub fn release_to(&mut self, position: u64) {
        assert!(
            position >= self.tail && position <= self.head,
            "release to {position} outside [{}, {}]",
            self.tail,
            self.head
        );
        self.tail = position;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_wrap_with_padding_and_release() {
        let arena = Arena::new(100, true);
        let mut ring = Ring::new(arena.capacity());
        assert_eq!(ring.reserve(60), Some(Reservation { padding: 0, position: 0 }));
        assert_eq!(ring.reserve(50), None);
        ring.release_to(60);
        // 40 bytes left before the end; 50 does not fit there, so it pads to the start.
        assert_eq!(ring.reserve(50), Some(Reservation { padding: 40, position: 100 }));
        assert_eq!(ring.used(), 90);
        assert!(ring.holds(100, 50) && !ring.holds(0, 10));
        // SAFETY: this test is the only user of the arena, and the two views do not overlap in
        // time.
        unsafe {
            arena.slice_mut(100, 50).fill(7);
            assert!(arena.slice(100, 50).iter().all(|&b| b == 7));
        }
    }
}
