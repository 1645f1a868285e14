//! The server-wide bound on write payload bytes held in buffers but not yet in the store.
//!
//! A connection reserves a frame's payload size before allocating the buffer it reads into and
//! releases it when the store has the bytes, so the sum of all connections' buffers never exceeds
//! `in_flight_bytes_max`. A reservation larger than the whole budget cannot happen: the
//! configuration requires `in_flight_bytes_max >= payload_bytes_max`.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

pub struct ByteBudget {
    used: Mutex<u64>,
    freed: Condvar,
    max: u64,
}

impl ByteBudget {
    pub fn new(max: u64) -> Self {
        assert!(max > 0);
        ByteBudget { used: Mutex::new(0), freed: Condvar::new(), max }
    }

    /// Blocks until `bytes` fit, then reserves them. The returned guard releases them.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        assert!(
            bytes <= self.max,
            "reservation of {bytes} bytes exceeds the budget of {}",
            self.max
        );
        let mut used = self.used.lock();
        while *used + bytes > self.max {
            self.freed.wait(&mut used);
        }
        *used += bytes;
        Reservation { budget: self.clone(), bytes }
    }

    pub fn used(&self) -> u64 {
        *self.used.lock()
    }

    pub fn max(&self) -> u64 {
        self.max
    }
}

/// Reserved budget, released on drop.
pub struct Reservation {
    budget: Arc<ByteBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock();
        assert!(*used >= self.bytes);
        *used -= self.bytes;
        drop(used);
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_exceed_the_budget() {
        let budget = Arc::new(ByteBudget::new(100));
        let peak = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (budget, peak) = (budget.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _r = budget.reserve(40);
                        let used = budget.used();
                        let mut p = peak.lock();
                        *p = (*p).max(used);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(*peak.lock() <= 100);
        assert!(*peak.lock() >= 40);
        assert_eq!(budget.used(), 0);
    }
}

/// Recycled payload buffers. Allocating and zeroing a fresh 1 MiB buffer per write costs page
/// faults and a memset per request; a bounded pool of returned buffers avoids both. The pool
/// holds at most `bytes_max` bytes in total (its memory is on top of the in-flight budget).
pub struct BufferPool {
    free: Mutex<(Vec<Vec<u8>>, u64)>,
    bytes_max: u64,
}

impl BufferPool {
    pub fn new(bytes_max: u64) -> Self {
        BufferPool { free: Mutex::new((Vec::new(), 0)), bytes_max }
    }

    /// A buffer of exactly `length` bytes (contents unspecified: the caller overwrites them).
    pub fn take(&self, length: usize) -> Vec<u8> {
        let recycled = {
            let mut free = self.free.lock();
            let found = free.0.iter().rposition(|b| b.capacity() >= length);
            found.map(|i| {
                let buffer = free.0.swap_remove(i);
                free.1 -= buffer.capacity() as u64;
                buffer
            })
        };
        let mut buffer = recycled.unwrap_or_default();
        buffer.resize(length, 0);
        buffer
    }

    /// Returns a buffer for reuse (dropped if the pool is full).
    pub fn give(&self, buffer: Vec<u8>) {
        let bytes = buffer.capacity() as u64;
        let mut free = self.free.lock();
        if free.1 + bytes <= self.bytes_max {
            free.1 += bytes;
            free.0.push(buffer);
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn pool_reuses_and_stays_bounded() {
        let pool = BufferPool::new(3000);
        let a = pool.take(1000);
        let pointer = a.as_ptr();
        pool.give(a);
        let b = pool.take(800);
        assert_eq!(b.len(), 800);
        assert_eq!(b.as_ptr(), pointer, "a returned buffer is reused");
        pool.give(b);
        pool.give(vec![0; 1500]);
        pool.give(vec![0; 1500]); // over the bound: dropped
        assert!(pool.free.lock().1 <= 3000);
    }
}
