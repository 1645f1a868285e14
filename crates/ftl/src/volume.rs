//! Several SSDs behind striping, as in a shared burst buffer: files are cut into stripe units
//! (chunks) that go round-robin over the SSDs of the file's pool.
//!
//! Logical space of each SSD is handed out in chunks of `stripe_unit_bytes` by a model of the
//! file system's block allocator ([`FileSystemModel`]). With TRIM on delete (the default, and
//! the first model built) a deleted file's pages are discarded at once, so the logical addresses
//! do not matter to a page-mapped FTL; only the order of writes and trims per stream does.
//!
//! Without TRIM (a Linux file system mounted without `discard`, which is the default for ext4
//! and XFS; BIOS 5.6 attributes its residual WAF of 1.04 to exactly this) a deleted file's pages
//! stay valid in the FTL until the file system hands the same logical addresses to a new file
//! and the overwrite invalidates them. Then the allocator decides *when* dead data dies in the
//! FTL, so it is modelled: LIFO reuse (`stack`), lowest free address (`first_fit`), or a cursor
//! sweeping the address space (`next_fit`, like ext4's stream allocation for large files, which
//! continues from the last allocation's goal).

use crate::ssd::{Ssd, SsdConfig, SsdConfigError, SsdCounters};
use std::collections::BTreeSet;

/// How the file system picks the logical chunk for the next stripe unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LbaAllocation {
    /// Most recently freed chunk first (a free stack; never-used chunks in address order last).
    Stack,
    /// Lowest free chunk address.
    FirstFit,
    /// Next free chunk at or after the previous allocation, wrapping at the end of the device.
    NextFit,
}

impl LbaAllocation {
    pub fn name(self) -> &'static str {
        match self {
            LbaAllocation::Stack => "stack",
            LbaAllocation::FirstFit => "first_fit",
            LbaAllocation::NextFit => "next_fit",
        }
    }

    pub fn parse(text: &str) -> Option<LbaAllocation> {
        [LbaAllocation::Stack, LbaAllocation::FirstFit, LbaAllocation::NextFit]
            .into_iter()
            .find(|a| a.name() == text || a.name().replace('_', "-") == text)
    }
}

/// The file system between the files and the SSDs: its allocator and whether it TRIMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileSystemModel {
    pub allocation: LbaAllocation,
    /// Discard a deleted file's chunks (online `discard`); off = they stay valid in the FTL
    /// until reused.
    pub trim_on_delete: bool,
}

impl Default for FileSystemModel {
    /// The first model: TRIM on delete, free stack (addresses then do not matter).
    fn default() -> Self {
        FileSystemModel { allocation: LbaAllocation::Stack, trim_on_delete: true }
    }
}

impl FileSystemModel {
    /// A Linux file system mounted without `discard`, allocating large files next-fit.
    pub const NO_DISCARD_NEXT_FIT: FileSystemModel =
        FileSystemModel { allocation: LbaAllocation::NextFit, trim_on_delete: false };

    pub fn name(&self) -> String {
        format!(
            "{}{}",
            if self.trim_on_delete { "trim+" } else { "no_trim+" },
            self.allocation.name()
        )
    }
}

/// Free chunks of one SSD under one allocation policy.
enum FreeChunks {
    Stack(Vec<u32>),
    /// Free chunk addresses and, for next-fit, the cursor (next address to try).
    Ordered {
        free: BTreeSet<u32>,
        cursor: Option<u32>,
    },
}

impl FreeChunks {
    fn new(allocation: LbaAllocation, chunks: u32) -> FreeChunks {
        match allocation {
            LbaAllocation::Stack => FreeChunks::Stack((0..chunks).rev().collect()),
            LbaAllocation::FirstFit => {
                FreeChunks::Ordered { free: (0..chunks).collect(), cursor: None }
            }
            LbaAllocation::NextFit => {
                FreeChunks::Ordered { free: (0..chunks).collect(), cursor: Some(0) }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            FreeChunks::Stack(v) => v.len(),
            FreeChunks::Ordered { free, .. } => free.len(),
        }
    }

    fn pop(&mut self) -> Option<u32> {
        match self {
            FreeChunks::Stack(v) => v.pop(),
            FreeChunks::Ordered { free, cursor: None } => free.pop_first(),
            FreeChunks::Ordered { free, cursor: Some(cursor) } => {
                let chunk = free.range(*cursor..).next().or_else(|| free.first()).copied()?;
                free.remove(&chunk);
                *cursor = chunk + 1;
                Some(chunk)
            }
        }
    }

    fn push(&mut self, chunk: u32) {
        match self {
            FreeChunks::Stack(v) => v.push(chunk),
            FreeChunks::Ordered { free, .. } => {
                let fresh = free.insert(chunk);
                assert!(fresh, "chunk {chunk} freed twice");
            }
        }
    }
}

/// A file laid out over a pool of SSDs; chunk `i` lives on [`StripedFile::ssd_of`]`(i)`.
#[derive(Clone, Debug, Default)]
pub struct StripedFile {
    pub pool_first_ssd: u16,
    pub stripe_count: u16,
    /// Rotation of the first chunk inside the pool.
    pub start: u16,
    /// Chunk id on its SSD per chunk ordinal (`crate::ssd::INVALID` = not allocated yet).
    pub chunks: Vec<u32>,
}

impl StripedFile {
    #[inline]
    pub fn ssd_of(&self, ordinal: usize) -> usize {
        self.pool_first_ssd as usize + (self.start as usize + ordinal) % self.stripe_count as usize
    }
}

/// The SSDs and their logical chunk allocators.
pub struct Volume {
    ssds: Vec<Ssd>,
    chunk_pages: u32,
    free_chunks: Vec<FreeChunks>,
    fs: FileSystemModel,
}

/// Why a volume cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error(transparent)]
    Ssd(#[from] SsdConfigError),
    #[error("stripe unit of {stripe_unit_bytes} bytes is not a positive multiple of the {page_bytes}-byte page")]
    StripeUnit { stripe_unit_bytes: u64, page_bytes: u32 },
    #[error("a volume needs at least one SSD")]
    NoSsd,
}

impl Volume {
    /// A volume under the default file system model (TRIM on delete, free stack).
    pub fn new(
        config: &SsdConfig,
        ssd_count: usize,
        stripe_unit_bytes: u64,
    ) -> Result<Volume, VolumeError> {
        Volume::with_file_system(config, ssd_count, stripe_unit_bytes, FileSystemModel::default())
    }

    pub fn with_file_system(
        config: &SsdConfig,
        ssd_count: usize,
        stripe_unit_bytes: u64,
        fs: FileSystemModel,
    ) -> Result<Volume, VolumeError> {
        if ssd_count == 0 {
            return Err(VolumeError::NoSsd);
        }
        let page = config.page_bytes as u64;
        if stripe_unit_bytes == 0 || !stripe_unit_bytes.is_multiple_of(page) {
            return Err(VolumeError::StripeUnit {
                stripe_unit_bytes,
                page_bytes: config.page_bytes,
            });
        }
        let chunk_pages = (stripe_unit_bytes / page) as u32;
        let chunks = config.logical_pages / chunk_pages;
        let mut ssds = Vec::with_capacity(ssd_count);
        for _ in 0..ssd_count {
            ssds.push(Ssd::new(config.clone())?);
        }
        let free_chunks = (0..ssd_count).map(|_| FreeChunks::new(fs.allocation, chunks)).collect();
        Ok(Volume { ssds, chunk_pages, free_chunks, fs })
    }

    pub fn file_system(&self) -> FileSystemModel {
        self.fs
    }

    pub fn ssds(&self) -> &[Ssd] {
        &self.ssds
    }

    /// One SSD, mutably (to switch on and drain its NAND operation log).
    pub fn ssd_mut(&mut self, ssd: usize) -> &mut Ssd {
        &mut self.ssds[ssd]
    }

    pub fn chunk_pages(&self) -> u32 {
        self.chunk_pages
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_pages as u64 * self.ssds[0].config().page_bytes as u64
    }

    /// Logical bytes of all SSDs usable for chunks.
    pub fn logical_bytes(&self) -> u64 {
        let per_ssd = (self.ssds[0].logical_pages() / self.chunk_pages) as u64 * self.chunk_bytes();
        per_ssd * self.ssds.len() as u64
    }

    pub fn free_chunks(&self, ssd: usize) -> usize {
        self.free_chunks[ssd].len()
    }

    pub fn allocate_chunk(&mut self, ssd: usize) -> Option<u32> {
        self.free_chunks[ssd].pop()
    }

    /// Writes `pages` pages of `chunk` on `ssd` starting at page `first_page` of the chunk.
    #[inline]
    pub fn write(&mut self, ssd: usize, chunk: u32, first_page: u32, pages: u32, stream: u16) {
        assert!(first_page + pages <= self.chunk_pages, "write past the end of chunk {chunk}");
        let base = chunk * self.chunk_pages + first_page;
        let device = &mut self.ssds[ssd];
        for lpn in base..base + pages {
            device.write(lpn, stream);
        }
    }

    /// Returns the chunk to the file system's free space, TRIMming its pages when the model
    /// has TRIM on delete (otherwise the FTL keeps them valid until the chunk is rewritten).
    pub fn release_chunk(&mut self, ssd: usize, chunk: u32) {
        if self.fs.trim_on_delete {
            let base = chunk * self.chunk_pages;
            let device = &mut self.ssds[ssd];
            for lpn in base..base + self.chunk_pages {
                device.trim(lpn);
            }
        }
        self.free_chunks[ssd].push(chunk);
    }

    /// Releases every allocated chunk of `file`.
    pub fn release_file(&mut self, file: &StripedFile) {
        for (ordinal, &chunk) in file.chunks.iter().enumerate() {
            if chunk != crate::ssd::INVALID {
                self.release_chunk(file.ssd_of(ordinal), chunk);
            }
        }
    }

    /// Counters summed over all SSDs.
    pub fn total_counters(&self) -> SsdCounters {
        let mut total = SsdCounters::default();
        for ssd in &self.ssds {
            let c = ssd.counters();
            total.host_pages += c.host_pages;
            total.gc_copied_pages += c.gc_copied_pages;
            total.erases += c.erases;
            total.trimmed_pages += c.trimmed_pages;
            total.foreground_gcs += c.foreground_gcs;
            total.busy_ns += c.busy_ns;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(allocation: LbaAllocation, trim_on_delete: bool) -> Volume {
        let config = SsdConfig::with_overprovisioning(64, 16, 4096, 0.25);
        Volume::with_file_system(
            &config,
            1,
            4 * 4096,
            FileSystemModel { allocation, trim_on_delete },
        )
        .unwrap()
    }

    fn write_chunk(v: &mut Volume, chunk: u32) {
        let pages = v.chunk_pages();
        v.write(0, chunk, 0, pages, 0);
    }

    #[test]
    fn allocators_hand_out_each_chunk_once_and_keep_count() {
        for allocation in [LbaAllocation::Stack, LbaAllocation::FirstFit, LbaAllocation::NextFit] {
            let mut v = volume(allocation, false);
            let total = v.free_chunks(0);
            let mut held = std::collections::BTreeSet::new();
            let mut rng = 12345u64;
            for step in 0..5000 {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if !(rng >> 33).is_multiple_of(3) || held.is_empty() {
                    if let Some(c) = v.allocate_chunk(0) {
                        assert!(
                            held.insert(c),
                            "{allocation:?}: chunk {c} handed out twice at step {step}"
                        );
                        write_chunk(&mut v, c);
                    } else {
                        assert_eq!(
                            held.len(),
                            total,
                            "{allocation:?}: allocator empty with free chunks left"
                        );
                    }
                } else {
                    let c = *held.iter().nth((rng >> 40) as usize % held.len()).unwrap();
                    held.remove(&c);
                    v.release_chunk(0, c);
                }
                assert_eq!(
                    held.len() + v.free_chunks(0),
                    total,
                    "{allocation:?}: chunks lost at step {step}"
                );
            }
            v.ssds()[0].check_invariants();
        }
    }

    #[test]
    fn first_fit_takes_the_lowest_and_next_fit_sweeps_on() {
        let mut first = volume(LbaAllocation::FirstFit, true);
        let mut next = volume(LbaAllocation::NextFit, true);
        for v in [&mut first, &mut next] {
            for expected in 0..6 {
                assert_eq!(v.allocate_chunk(0), Some(expected));
            }
            v.release_chunk(0, 1);
            v.release_chunk(0, 3);
        }
        assert_eq!(first.allocate_chunk(0), Some(1));
        assert_eq!(first.allocate_chunk(0), Some(3));
        assert_eq!(first.allocate_chunk(0), Some(6));
        // Next-fit continues after chunk 5 and only comes back to 1 and 3 after wrapping.
        let chunks = next.free_chunks(0) as u32;
        let sweep: Vec<u32> = (0..chunks).map(|_| next.allocate_chunk(0).unwrap()).collect();
        assert_eq!(sweep[0], 6);
        assert_eq!(&sweep[sweep.len() - 2..], &[1, 3]);
        assert_eq!(next.allocate_chunk(0), None);
    }

    #[test]
    fn without_trim_deleted_data_stays_valid_until_its_chunk_is_rewritten() {
        for trim in [true, false] {
            let mut v = volume(LbaAllocation::Stack, trim);
            let c = v.allocate_chunk(0).unwrap();
            write_chunk(&mut v, c);
            v.release_chunk(0, c);
            let base = c * v.chunk_pages();
            let mapped =
                (base..base + v.chunk_pages()).filter(|&l| v.ssds()[0].is_mapped(l)).count();
            assert_eq!(
                mapped,
                if trim { 0 } else { v.chunk_pages() as usize },
                "trim_on_delete = {trim}"
            );
            assert_eq!(
                v.total_counters().trimmed_pages,
                if trim { v.chunk_pages() as u64 } else { 0 }
            );
            // Stack reuse hands the same chunk back; rewriting it invalidates the stale copy.
            assert_eq!(v.allocate_chunk(0), Some(c));
            write_chunk(&mut v, c);
            v.ssds()[0].check_invariants();
        }
    }
}
