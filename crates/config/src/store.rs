//! Knobs of the log-structured store. Owned by the store; validated here.
//!
//! Every size is in bytes and every time in milliseconds; the test suites shrink the DRAM tier
//! and the segment size to force spills and GC (simulation extremes), production keeps defaults.

use crate::{knobs, ConfigError};
use spillway_types::{KIB, MIB};

knobs! {
    /// The log-structured store of one burst buffer server.
    section "store";
    pub struct StoreKnobs {
        /// Directory holding the SSD log segments.
        ssd_directory: String = "/var/lib/spillway/ssd".to_string(), unit = "path";
        /// Capacity of the DRAM log (one ring buffer allocated at open).
        dram_bytes_max: u64 = 1024 * MIB, unit = "bytes";
        /// Capacity of the SSD log (all segment files together, headers and dead bytes included).
        ssd_bytes_max: u64 = 64 * 1024 * MIB, unit = "bytes";
        /// Size at which a segment is sealed and the stream opens a new one (large: commits fsync each touched segment).
        segment_bytes_max: u64 = 256 * MIB, unit = "bytes";
        /// Largest payload of one record; larger writes are split into several records.
        record_payload_bytes_max: u64 = 4 * MIB, unit = "bytes";
        /// DRAM use above which the background flusher starts appending the oldest data to SSD.
        dram_high_watermark_percent: u64 = 75, unit = "percent";
        /// DRAM use the flusher spills down to once it has started.
        dram_low_watermark_percent: u64 = 50, unit = "percent";
        /// Live bytes a stream may hold (DRAM + SSD); 0 means no per-stream quota.
        stream_quota_bytes: u64 = 0, unit = "bytes";
        /// Compaction starts when SSD free space falls below this share of `ssd_bytes_max`.
        gc_free_percent_min: u64 = 10, unit = "percent";
        /// Only segments whose live share is at most this are compacted (cost-benefit victims).
        gc_live_percent_max: u64 = 80, unit = "percent";
        /// Longest a write waits for the flusher to free DRAM before failing.
        dram_wait_ms_max: u64 = 30_000, unit = "milliseconds";
        /// How often the background flusher wakes up when nobody signals it.
        flusher_interval_ms: u64 = 50, unit = "milliseconds";
        /// Bytes the flusher moves to SSD per lock round trip (bounds its in-flight I/O).
        flusher_batch_bytes: u64 = 8 * MIB, unit = "bytes";
        /// Spills and write-throughs write their whole 4 KiB blocks with O_DIRECT: 35-40 % less CPU per GB, but slower where appending direct writes serialise (ext4 on the reference machine: 0.61-0.76x the page-cache path in `spillway bench ingress --durable-only`); measure before turning it on.
        ssd_direct_io: bool = false, unit = "bool";
        /// Bytes spilled or written through to SSD since the last fsync round at which a background round starts (write-behind durability: a commit's fsync then finds at most about this much left to flush); 0 = only commits and syncs fsync.
        ssd_sync_behind_bytes: u64 = 32 * MIB, unit = "bytes";
        /// Spill each batch of new records (`flusher_batch_bytes`) to SSD as it arrives, below the DRAM watermarks, keeping the ring copy as a clean cache for reads until the ring needs the room: an `ssd` commit or a mount's fsync then finds the data written and mostly flushed. Costs SSD writes for data deleted before it would otherwise have spilled, so `spillway serve` turns it off when `server.commit_durability` is memory.
        ssd_write_behind: bool = true, unit = "bool";
        /// Drop spilled segment bytes from the kernel's page cache once they are written back (the DRAM log is the store's cache; a second copy in the page cache makes every spill allocate fresh pages, which on the reference VM cost about 6x the copy itself).
        ssd_drop_behind: bool = true, unit = "bool";
        /// Touch every DRAM page at open so ingest never pays first-touch page faults.
        dram_prefault: bool = true, unit = "bool";
        /// Text log of every segment append and deletion, for the FTL simulator; empty = off.
        ssd_write_log_path: String = String::new(), unit = "path";
        /// Smallest DRAM log accepted (guards against configurations that cannot hold a record).
        dram_bytes_min: u64 = 64 * KIB, unit = "bytes";
        /// Space kept in a preallocated RESERVE file in the SSD directory and released when its file system fills, so tombstones, commit records and compaction still get a segment; 0 = none.
        ssd_reserve_bytes: u64 = 64 * MIB, unit = "bytes";
        /// Largest file: a write whose end (offset + length) passes it is refused whole with EFBIG; at most 2^62.
        file_bytes_max: u64 = 1 << 44, unit = "bytes";
    }
}

/// Largest `file_bytes_max` accepted: file ends stay far from u64 overflow in every offset sum.
pub const FILE_BYTES_MAX_LIMIT: u64 = 1 << 62;

impl StoreKnobs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_capacities()?;
        self.validate_percentages_and_flusher()
    }

    /// The error naming knob `name` of this section, its `value` and why it is refused.
    fn invalid(name: &'static str, value: u64, reason: String) -> ConfigError {
        ConfigError::invalid(Self::SECTION, name, value, reason)
    }

    /// Step 1 of `validate`: the DRAM log, record, segment and SSD sizes fit inside one another.
    fn validate_capacities(&self) -> Result<(), ConfigError> {
        if self.dram_bytes_max < self.dram_bytes_min {
            return Err(Self::invalid(
                "dram_bytes_max",
                self.dram_bytes_max,
                format!(
                    "the DRAM log needs at least dram_bytes_min = {} bytes",
                    self.dram_bytes_min
                ),
            ));
        }
        if self.record_payload_bytes_max == 0 || self.record_payload_bytes_max > u32::MAX as u64 {
            return Err(Self::invalid(
                "record_payload_bytes_max",
                self.record_payload_bytes_max,
                "must be between 1 and 4 GiB - 1 (the header stores a u32 length)".into(),
            ));
        }
        // Two records must fit in DRAM so one can be written while another is spilled.
        if self.dram_bytes_max < 2 * (self.record_payload_bytes_max + 128) {
            return Err(Self::invalid(
                "dram_bytes_max",
                self.dram_bytes_max,
                format!(
                    "must hold two records of record_payload_bytes_max = {} bytes",
                    self.record_payload_bytes_max
                ),
            ));
        }
        if self.segment_bytes_max < self.record_payload_bytes_max + 256 {
            return Err(Self::invalid(
                "segment_bytes_max",
                self.segment_bytes_max,
                "must hold at least one record of record_payload_bytes_max plus headers".into(),
            ));
        }
        if self.file_bytes_max == 0 || self.file_bytes_max > FILE_BYTES_MAX_LIMIT {
            return Err(Self::invalid(
                "file_bytes_max",
                self.file_bytes_max,
                format!("must be between 1 and 2^62 = {FILE_BYTES_MAX_LIMIT} bytes"),
            ));
        }
        if self.ssd_bytes_max < 4 * self.segment_bytes_max {
            return Err(Self::invalid(
                "ssd_bytes_max",
                self.ssd_bytes_max,
                format!(
                    "must hold at least four segments of segment_bytes_max = {} bytes",
                    self.segment_bytes_max
                ),
            ));
        }
        Ok(())
    }

    /// Step 2 of `validate`: the DRAM watermarks and GC shares are percentages in order, and the
    /// flusher has a positive batch and interval.
    fn validate_percentages_and_flusher(&self) -> Result<(), ConfigError> {
        if self.dram_low_watermark_percent >= self.dram_high_watermark_percent
            || self.dram_high_watermark_percent > 100
        {
            return Err(Self::invalid(
                "dram_low_watermark_percent",
                self.dram_low_watermark_percent,
                format!(
                    "must be below dram_high_watermark_percent = {} (which must be ≤ 100)",
                    self.dram_high_watermark_percent
                ),
            ));
        }
        if self.gc_free_percent_min >= 100 || self.gc_live_percent_max > 100 {
            return Err(Self::invalid(
                "gc_free_percent_min",
                self.gc_free_percent_min,
                "percentages must be below 100".into(),
            ));
        }
        if self.flusher_batch_bytes == 0 || self.flusher_interval_ms == 0 {
            return Err(Self::invalid(
                "flusher_batch_bytes",
                self.flusher_batch_bytes,
                "flusher batch and interval must be positive".into(),
            ));
        }
        Ok(())
    }
}
