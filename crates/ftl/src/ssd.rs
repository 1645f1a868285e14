//! One simulated SSD: a page-mapped FTL with multi-stream open blocks, greedy / FIFO /
//! cost-benefit victim choice, a GC reserve, TRIM, wear counters and a NAND time model.
//!
//! Why page-mapped: every modern SSD maps at page (or 4 KiB) granularity; block- and
//! hybrid-mapped FTLs add their own merge costs that would hide the effect we study (which data
//! shares an erase block). Everything is flat `Vec`s indexed by `u32` so the write path does no
//! allocation: `l2p` (logical → physical page), `p2l` (physical → logical, `INVALID` when stale),
//! per-block valid counts, and for greedy an intrusive bucket list of closed blocks by valid
//! count, so picking the victim is a short scan of at most `pages_per_block + 1` bucket heads.
//!
//! Invariants (checked by [`Ssd::check_invariants`] in tests): a physical page is valid iff
//! `l2p[p2l[p]] == p`; a block's valid count equals its valid pages; free + open + closed blocks
//! = all blocks; host allocation only happens while more than `gc_reserve_blocks` are free.

use std::collections::VecDeque;

/// Marks an unmapped logical page or a stale physical page.
pub const INVALID: u32 = u32::MAX;

/// How the FTL picks the block to clean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VictimPolicy {
    /// Fewest valid pages (ties: lowest block id in the bucket order).
    Greedy,
    /// Oldest closed block (a circular log; the closed form of the WAF holds for it).
    Fifo,
    /// Maximise age × (1 − u) / 2u (Rosenblum & Ousterhout's LFS cleaner).
    CostBenefit,
}

/// Where GC copies are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GcPlacement {
    /// One GC open block for all copies, whatever stream they came from.
    Shared,
    /// One GC open block per stream: copies stay with their stream's data.
    PerStream,
}

/// Datasheet-like NAND timing. The device is modelled as `parallel_units` dies working in
/// parallel, each block living on one die. `busy_ns` counts the fluid model's device time:
/// every NAND operation costs its latency ÷ `parallel_units` (a host page `page_program_us / P`,
/// a GC copy `(page_read_us + page_program_us) / P`, an erase `block_erase_us / P`), charged
/// before the host write that triggered it. `device_model` says which time model a workload
/// with time uses: that fluid one, or the per-die queues of [`crate::device`], which replay the
/// operations the FTL logs ([`NandOp`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NandTiming {
    pub page_read_us: f64,
    pub page_program_us: f64,
    pub block_erase_us: f64,
    pub parallel_units: u32,
    #[serde(default)]
    pub device_model: crate::device::DeviceModel,
    #[serde(default)]
    pub gc_preemption: crate::device::GcPreemption,
}

/// One NAND operation as the FTL performed it, for the queued device model (in order: the GC
/// work of a foreground collection comes right before the host program that triggered it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NandOp {
    /// A host page program on `stream`.
    HostProgram { stream: u16 },
    /// A valid page copied out of block `victim` (read there, programmed elsewhere).
    GcCopy { victim: u32 },
    /// An erase of `block`.
    Erase { block: u32 },
}

impl Default for NandTiming {
    /// TLC NAND of a PM963-class datacenter SSD: 16 KiB pages, ~60 µs read, ~500 µs program,
    /// ~3.5 ms erase, 32 dies (≈1 GB/s sequential write without GC).
    fn default() -> Self {
        NandTiming {
            page_read_us: 60.0,
            page_program_us: 500.0,
            block_erase_us: 3500.0,
            parallel_units: 32,
            device_model: crate::device::DeviceModel::default(),
            gc_preemption: crate::device::GcPreemption::default(),
        }
    }
}

/// Shape and policies of one SSD.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SsdConfig {
    pub blocks: u32,
    pub pages_per_block: u32,
    pub page_bytes: u32,
    /// Logical pages exported to the host; the rest of the physical pages is over-provisioning.
    pub logical_pages: u32,
    /// Free blocks kept for GC: host writes wait for GC while free blocks ≤ this.
    pub gc_reserve_blocks: u32,
    pub victim: VictimPolicy,
    /// Host write streams, each with its own open block.
    pub streams: u16,
    pub gc_placement: GcPlacement,
    pub timing: NandTiming,
}

/// Why an SSD cannot be built from a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SsdConfigError {
    #[error("ssd geometry {field} = {value}: {reason}")]
    Geometry { field: &'static str, value: u64, reason: &'static str },
    #[error(
        "over-provisioning too small: {spare_blocks} spare blocks (physical {blocks} − logical \
         {logical_blocks}) must exceed the GC reserve ({reserve}) plus the open blocks ({open})"
    )]
    Spare { spare_blocks: u64, blocks: u32, logical_blocks: u64, reserve: u32, open: u32 },
}

impl SsdConfig {
    /// A configuration with `overprovision_fraction` of the physical pages hidden from the host.
    pub fn with_overprovisioning(
        blocks: u32,
        pages_per_block: u32,
        page_bytes: u32,
        overprovision_fraction: f64,
    ) -> SsdConfig {
        let physical = blocks as f64 * pages_per_block as f64;
        let logical = (physical * (1.0 - overprovision_fraction)).floor() as u32;
        SsdConfig {
            blocks,
            pages_per_block,
            page_bytes,
            logical_pages: logical,
            gc_reserve_blocks: 2,
            victim: VictimPolicy::Greedy,
            streams: 1,
            gc_placement: GcPlacement::PerStream,
            timing: NandTiming::default(),
        }
    }

    pub fn physical_pages(&self) -> u64 {
        self.blocks as u64 * self.pages_per_block as u64
    }

    /// Open blocks the FTL keeps (host streams + GC streams).
    pub fn open_slots(&self) -> u32 {
        let gc = match self.gc_placement {
            GcPlacement::Shared => 1,
            GcPlacement::PerStream => self.streams as u32,
        };
        self.streams as u32 + gc
    }

    pub fn validate(&self) -> Result<(), SsdConfigError> {
        let geometry =
            |field, value: u64, reason| Err(SsdConfigError::Geometry { field, value, reason });
        if self.pages_per_block < 2 {
            return geometry("pages_per_block", self.pages_per_block as u64, "needs at least 2");
        }
        if self.page_bytes == 0 {
            return geometry("page_bytes", 0, "must be positive");
        }
        if self.gc_reserve_blocks == 0 {
            return geometry(
                "gc_reserve_blocks",
                0,
                "GC needs at least one free block to copy into",
            );
        }
        if self.streams == 0 {
            return geometry("streams", 0, "needs at least one stream");
        }
        if self.logical_pages == 0 {
            return geometry("logical_pages", 0, "must be positive");
        }
        if self.physical_pages() >= INVALID as u64 {
            return geometry("blocks", self.blocks as u64, "physical pages must fit in u32");
        }
        let logical_blocks = (self.logical_pages as u64).div_ceil(self.pages_per_block as u64);
        let spare_blocks = (self.blocks as u64).saturating_sub(logical_blocks);
        if spare_blocks <= self.gc_reserve_blocks as u64 + self.open_slots() as u64 {
            return Err(SsdConfigError::Spare {
                spare_blocks,
                blocks: self.blocks,
                logical_blocks,
                reserve: self.gc_reserve_blocks,
                open: self.open_slots(),
            });
        }
        Ok(())
    }
}

/// Cumulative counters of one SSD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SsdCounters {
    pub host_pages: u64,
    pub gc_copied_pages: u64,
    pub erases: u64,
    pub trimmed_pages: u64,
    /// Number of GC invocations that host writes had to wait for.
    pub foreground_gcs: u64,
    /// Device busy time (host programs + GC copies + erases), in nanoseconds.
    pub busy_ns: u64,
}

impl SsdCounters {
    /// NAND pages programmed ÷ host pages written (1.0 before any write).
    pub fn waf(&self) -> f64 {
        if self.host_pages == 0 {
            1.0
        } else {
            (self.host_pages + self.gc_copied_pages) as f64 / self.host_pages as f64
        }
    }

    /// WAF of the interval since `earlier`.
    pub fn waf_since(&self, earlier: &SsdCounters) -> f64 {
        let host = self.host_pages - earlier.host_pages;
        let copies = self.gc_copied_pages - earlier.gc_copied_pages;
        if host == 0 {
            1.0
        } else {
            (host + copies) as f64 / host as f64
        }
    }
}

const FREE: u8 = 0;
const OPEN: u8 = 1;
const CLOSED: u8 = 2;

#[derive(Clone, Copy, Debug)]
struct OpenSlot {
    block: u32,
    next_page: u32,
}

/// The simulated device.
pub struct Ssd {
    config: SsdConfig,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    state: Vec<u8>,
    /// Stream (0..streams) whose data the block holds.
    block_stream: Vec<u16>,
    /// Host-page counter when the block was closed (age for FIFO / cost-benefit).
    closed_at: Vec<u64>,
    erase_count: Vec<u32>,
    free: VecDeque<u32>,
    /// Host slots `0..streams`, then GC slots.
    slots: Vec<Option<OpenSlot>>,
    // Greedy: closed blocks in intrusive doubly linked lists, one per valid count.
    bucket_head: Vec<u32>,
    bucket_next: Vec<u32>,
    bucket_prev: Vec<u32>,
    // FIFO: closed blocks in closing order.
    fifo: VecDeque<u32>,
    counters: SsdCounters,
    /// NAND operations since the last [`Ssd::take_ops`], when recording (queued device model).
    ops: Vec<NandOp>,
    record_ops: bool,
    program_ns: u64,
    copy_ns: u64,
    erase_ns: u64,
}

impl Ssd {
    pub fn new(config: SsdConfig) -> Result<Ssd, SsdConfigError> {
        config.validate()?;
        let blocks = config.blocks as usize;
        let physical = config.physical_pages() as usize;
        let slots = config.open_slots() as usize;
        let units = config.timing.parallel_units.max(1) as f64;
        let program_ns = (config.timing.page_program_us * 1000.0 / units).round() as u64;
        let copy_ns = ((config.timing.page_read_us + config.timing.page_program_us) * 1000.0
            / units)
            .round() as u64;
        let erase_ns = (config.timing.block_erase_us * 1000.0 / units).round() as u64;
        Ok(Ssd {
            l2p: vec![INVALID; config.logical_pages as usize],
            p2l: vec![INVALID; physical],
            valid: vec![0; blocks],
            state: vec![FREE; blocks],
            block_stream: vec![0; blocks],
            closed_at: vec![0; blocks],
            erase_count: vec![0; blocks],
            free: (0..config.blocks).collect(),
            slots: vec![None; slots],
            bucket_head: vec![INVALID; config.pages_per_block as usize + 1],
            bucket_next: vec![INVALID; blocks],
            bucket_prev: vec![INVALID; blocks],
            fifo: VecDeque::with_capacity(blocks),
            counters: SsdCounters::default(),
            ops: Vec::new(),
            record_ops: false,
            program_ns,
            copy_ns,
            erase_ns,
            config,
        })
    }

    pub fn config(&self) -> &SsdConfig {
        &self.config
    }

    pub fn logical_pages(&self) -> u32 {
        self.config.logical_pages
    }

    pub fn counters(&self) -> SsdCounters {
        self.counters
    }

    pub fn erase_counts(&self) -> &[u32] {
        &self.erase_count
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Starts or stops logging NAND operations for [`Ssd::take_ops`].
    pub fn record_ops(&mut self, on: bool) {
        self.record_ops = on;
        self.ops.clear();
    }

    /// Moves the logged operations (oldest first) into `into`, which is cleared first. The
    /// caller drains after every stripe unit, so the log stays bounded by one unit's pages
    /// plus one GC episode.
    pub fn take_ops(&mut self, into: &mut Vec<NandOp>) {
        into.clear();
        std::mem::swap(&mut self.ops, into);
    }

    /// Whether a logical page currently holds data.
    pub fn is_mapped(&self, lpn: u32) -> bool {
        self.l2p[lpn as usize] != INVALID
    }

    /// Host write of one logical page on `stream`. Runs foreground GC first when the free pool
    /// is down to the reserve.
    #[inline]
    pub fn write(&mut self, lpn: u32, stream: u16) {
        assert!(lpn < self.config.logical_pages, "logical page {lpn} beyond the device");
        assert!(
            stream < self.config.streams,
            "stream {stream} beyond the device's {}",
            self.config.streams
        );
        let old = self.l2p[lpn as usize];
        if old != INVALID {
            self.invalidate(old);
        }
        let ppn = self.next_page(stream as usize, stream, true);
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn;
        self.counters.host_pages += 1;
        self.counters.busy_ns += self.program_ns;
        if self.record_ops {
            self.ops.push(NandOp::HostProgram { stream });
        }
    }

    /// TRIM (discard) of one logical page: the FTL forgets it, GC will not copy it.
    #[inline]
    pub fn trim(&mut self, lpn: u32) {
        assert!(lpn < self.config.logical_pages, "logical page {lpn} beyond the device");
        let old = self.l2p[lpn as usize];
        if old != INVALID {
            self.invalidate(old);
            self.l2p[lpn as usize] = INVALID;
            self.counters.trimmed_pages += 1;
        }
    }

    #[inline]
    fn invalidate(&mut self, ppn: u32) {
        let block = ppn / self.config.pages_per_block;
        debug_assert!(self.p2l[ppn as usize] != INVALID);
        self.p2l[ppn as usize] = INVALID;
        let b = block as usize;
        let before = self.valid[b];
        assert!(before > 0, "block {block} valid count underflow");
        self.valid[b] = before - 1;
        if self.state[b] == CLOSED && self.config.victim == VictimPolicy::Greedy {
            self.bucket_unlink(block, before);
            self.bucket_push(block, before - 1);
        }
    }

    /// The next physical page of `slot`, opening a block when needed. Host slots may trigger GC.
    #[inline]
    fn next_page(&mut self, slot: usize, stream: u16, host: bool) -> u32 {
        let ppb = self.config.pages_per_block;
        let current = match self.slots[slot] {
            Some(open) if open.next_page < ppb => open,
            full => {
                if let Some(open) = full {
                    self.close_block(open.block);
                }
                if host && self.free.len() <= self.config.gc_reserve_blocks as usize {
                    self.collect_garbage();
                }
                let block =
                    self.free.pop_front().expect("free pool exhausted: GC reserve too small");
                self.state[block as usize] = OPEN;
                self.block_stream[block as usize] = stream;
                OpenSlot { block, next_page: 0 }
            }
        };
        let ppn = current.block * ppb + current.next_page;
        self.slots[slot] =
            Some(OpenSlot { block: current.block, next_page: current.next_page + 1 });
        self.valid[current.block as usize] += 1;
        ppn
    }

    fn close_block(&mut self, block: u32) {
        let b = block as usize;
        assert_eq!(self.state[b], OPEN);
        self.state[b] = CLOSED;
        self.closed_at[b] = self.counters.host_pages;
        match self.config.victim {
            VictimPolicy::Greedy => self.bucket_push(block, self.valid[b]),
            VictimPolicy::Fifo => self.fifo.push_back(block),
            VictimPolicy::CostBenefit => {}
        }
    }

    /// Foreground GC: clean victims until more than the reserve is free.
    fn collect_garbage(&mut self) {
        self.counters.foreground_gcs += 1;
        let target = self.config.gc_reserve_blocks as usize + 1;
        // Each round erases one block; a round can consume at most one block's worth of copies,
        // so a bounded number of rounds must reach the target unless the device is full of
        // valid data (which validate() rules out).
        let mut rounds = 0u32;
        while self.free.len() < target {
            rounds += 1;
            assert!(rounds <= self.config.blocks * 2, "GC made no progress after {rounds} victims");
            let victim = self.pick_victim();
            self.clean(victim);
        }
    }

    fn pick_victim(&mut self) -> u32 {
        match self.config.victim {
            VictimPolicy::Greedy => {
                let bucket = self
                    .bucket_head
                    .iter()
                    .position(|&head| head != INVALID)
                    .expect("no closed block to clean");
                let block = self.bucket_head[bucket];
                self.bucket_unlink(block, bucket as u32);
                block
            }
            VictimPolicy::Fifo => self.fifo.pop_front().expect("no closed block to clean"),
            VictimPolicy::CostBenefit => {
                let now = self.counters.host_pages;
                let ppb = self.config.pages_per_block as f64;
                let mut best = INVALID;
                let mut best_score = f64::NEG_INFINITY;
                for (block, &state) in self.state.iter().enumerate() {
                    if state != CLOSED {
                        continue;
                    }
                    let u = self.valid[block] as f64 / ppb;
                    let age = (now - self.closed_at[block]) as f64 + 1.0;
                    let score = if u == 0.0 { f64::INFINITY } else { age * (1.0 - u) / (2.0 * u) };
                    if score > best_score {
                        best_score = score;
                        best = block as u32;
                    }
                }
                assert!(best != INVALID, "no closed block to clean");
                best
            }
        }
    }

    /// Copies the victim's valid pages to the GC slot of its stream and erases it.
    fn clean(&mut self, victim: u32) {
        let v = victim as usize;
        assert_eq!(self.state[v], CLOSED, "victim {victim} is not a closed block");
        let stream = self.block_stream[v];
        let slot = match self.config.gc_placement {
            GcPlacement::Shared => self.config.streams as usize,
            GcPlacement::PerStream => self.config.streams as usize + stream as usize,
        };
        let ppb = self.config.pages_per_block;
        let first = victim * ppb;
        for ppn in first..first + ppb {
            if self.valid[v] == 0 {
                break;
            }
            let lpn = self.p2l[ppn as usize];
            if lpn == INVALID {
                continue;
            }
            self.p2l[ppn as usize] = INVALID;
            self.valid[v] -= 1;
            let target = self.next_page(slot, stream, false);
            self.p2l[target as usize] = lpn;
            self.l2p[lpn as usize] = target;
            self.counters.gc_copied_pages += 1;
            self.counters.busy_ns += self.copy_ns;
            if self.record_ops {
                self.ops.push(NandOp::GcCopy { victim });
            }
        }
        assert_eq!(self.valid[v], 0, "victim {victim} still holds valid pages after cleaning");
        self.state[v] = FREE;
        self.erase_count[v] += 1;
        self.counters.erases += 1;
        self.counters.busy_ns += self.erase_ns;
        if self.record_ops {
            self.ops.push(NandOp::Erase { block: victim });
        }
        self.free.push_back(victim);
    }

    fn bucket_push(&mut self, block: u32, bucket: u32) {
        let head = self.bucket_head[bucket as usize];
        self.bucket_next[block as usize] = head;
        self.bucket_prev[block as usize] = INVALID;
        if head != INVALID {
            self.bucket_prev[head as usize] = block;
        }
        self.bucket_head[bucket as usize] = block;
    }

    fn bucket_unlink(&mut self, block: u32, bucket: u32) {
        let next = self.bucket_next[block as usize];
        let prev = self.bucket_prev[block as usize];
        if prev == INVALID {
            debug_assert_eq!(self.bucket_head[bucket as usize], block);
            self.bucket_head[bucket as usize] = next;
        } else {
            self.bucket_next[prev as usize] = next;
        }
        if next != INVALID {
            self.bucket_prev[next as usize] = prev;
        }
    }

    /// Full consistency check (O(physical pages)); for tests and debugging.
    pub fn check_invariants(&self) {
        let ppb = self.config.pages_per_block;
        let mut valid = vec![0u32; self.config.blocks as usize];
        for (ppn, &lpn) in self.p2l.iter().enumerate() {
            if lpn != INVALID {
                assert_eq!(
                    self.l2p[lpn as usize], ppn as u32,
                    "p2l/l2p disagree at physical page {ppn}"
                );
                valid[ppn / ppb as usize] += 1;
            }
        }
        for (lpn, &ppn) in self.l2p.iter().enumerate() {
            if ppn != INVALID {
                assert_eq!(
                    self.p2l[ppn as usize], lpn as u32,
                    "l2p/p2l disagree at logical page {lpn}"
                );
            }
        }
        assert_eq!(valid, self.valid, "valid counts drifted");
        let free = self.state.iter().filter(|&&s| s == FREE).count();
        assert_eq!(free, self.free.len(), "free list and block states disagree");
        if self.config.victim == VictimPolicy::Greedy {
            let mut listed = 0;
            for (bucket, &head) in self.bucket_head.iter().enumerate() {
                let mut block = head;
                while block != INVALID {
                    assert_eq!(
                        self.valid[block as usize], bucket as u32,
                        "block {block} in wrong bucket"
                    );
                    assert_eq!(self.state[block as usize], CLOSED);
                    listed += 1;
                    block = self.bucket_next[block as usize];
                }
            }
            let closed = self.state.iter().filter(|&&s| s == CLOSED).count();
            assert_eq!(listed, closed, "greedy buckets lost a closed block");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn small(victim: VictimPolicy, streams: u16, placement: GcPlacement) -> Ssd {
        let mut config = SsdConfig::with_overprovisioning(64, 16, 4096, 0.25);
        config.victim = victim;
        config.streams = streams;
        config.gc_placement = placement;
        Ssd::new(config).unwrap()
    }

    #[test]
    fn random_overwrites_keep_invariants_under_every_policy() {
        for victim in [VictimPolicy::Greedy, VictimPolicy::Fifo, VictimPolicy::CostBenefit] {
            for placement in [GcPlacement::Shared, GcPlacement::PerStream] {
                let mut ssd = small(victim, 3, placement);
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
                let logical = ssd.logical_pages();
                for i in 0..20_000u32 {
                    let lpn = rng.gen_range(0..logical);
                    if i % 7 == 0 {
                        ssd.trim(lpn);
                    } else {
                        ssd.write(lpn, (lpn % 3) as u16);
                    }
                    if i % 2500 == 0 {
                        ssd.check_invariants();
                    }
                }
                ssd.check_invariants();
                let c = ssd.counters();
                assert!(c.erases > 0 && c.gc_copied_pages > 0, "{victim:?}: GC never ran");
                assert!(c.waf() > 1.0);
            }
        }
    }

    #[test]
    fn trim_means_no_copies() {
        // Write the whole device, trim it all, write it again: nothing is valid when GC runs.
        let mut ssd = small(VictimPolicy::Greedy, 1, GcPlacement::Shared);
        for round in 0..5 {
            for lpn in 0..ssd.logical_pages() {
                ssd.write(lpn, 0);
            }
            for lpn in 0..ssd.logical_pages() {
                ssd.trim(lpn);
            }
            ssd.check_invariants();
            assert_eq!(ssd.counters().gc_copied_pages, 0, "round {round}");
        }
        assert!(ssd.counters().erases > 0);
    }

    #[test]
    fn too_little_spare_is_refused_with_the_numbers() {
        let mut config = SsdConfig::with_overprovisioning(16, 16, 4096, 0.05);
        config.streams = 4;
        let error = Ssd::new(config).err().expect("must refuse").to_string();
        assert!(error.contains("spare blocks"), "{error}");
        let mut config = SsdConfig::with_overprovisioning(64, 16, 4096, 0.25);
        config.gc_reserve_blocks = 0;
        let error = Ssd::new(config).err().expect("must refuse").to_string();
        assert!(error.contains("gc_reserve_blocks"), "{error}");
    }

    #[test]
    fn the_op_log_puts_gc_work_before_the_host_program_that_triggered_it() {
        let mut ssd = small(VictimPolicy::Greedy, 1, GcPlacement::Shared);
        ssd.record_ops(true);
        let mut ops = Vec::new();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let logical = ssd.logical_pages();
        let mut seen_gc = false;
        for _ in 0..20_000 {
            let before = ssd.counters();
            ssd.write(rng.gen_range(0..logical), 0);
            ssd.take_ops(&mut ops);
            let after = ssd.counters();
            // Exactly the work the counters saw, the host program last.
            assert_eq!(ops.last(), Some(&NandOp::HostProgram { stream: 0 }));
            let copies = ops.iter().filter(|o| matches!(o, NandOp::GcCopy { .. })).count();
            let erases = ops.iter().filter(|o| matches!(o, NandOp::Erase { .. })).count();
            assert_eq!(copies as u64, after.gc_copied_pages - before.gc_copied_pages);
            assert_eq!(erases as u64, after.erases - before.erases);
            assert_eq!(ops.len(), copies + erases + 1);
            seen_gc |= erases > 0;
        }
        assert!(seen_gc, "GC never ran");
        ssd.record_ops(false);
        ssd.write(0, 0);
        ssd.take_ops(&mut ops);
        assert!(ops.is_empty(), "nothing is logged when not recording");
    }

    #[test]
    fn busy_time_counts_programs_copies_and_erases() {
        let mut ssd = small(VictimPolicy::Greedy, 1, GcPlacement::Shared);
        ssd.write(0, 0);
        let t = NandTiming::default();
        assert_eq!(
            ssd.counters().busy_ns,
            (t.page_program_us * 1000.0 / t.parallel_units as f64).round() as u64
        );
    }
}
