//! Knobs of the FTL simulator (section `ftl`), declared once with unit, default and doc.
//!
//! Defaults describe a PM963-class datacenter SSD scaled down in block count so a BIOS run
//! finishes in seconds: 16 KiB TLC pages, 256-page (4 MiB) blocks, 12.7 % over-provisioning
//! (960 GB exported of 1 TiB raw), 8 streams, and datasheet-like NAND latencies.

use crate::device::{DeviceModel, GcPreemption};
use crate::ssd::{GcPlacement, NandTiming, SsdConfig, SsdConfigError, VictimPolicy};
use crate::volume::{FileSystemModel, LbaAllocation};
use spillway_config::knobs;
use spillway_types::KIB;

knobs! {
    /// The FTL simulator (`spillway ftl`).
    section "ftl";
    pub struct FtlKnobs {
        /// NAND page size.
        page_bytes: u32 = 16 * 1024, unit = "bytes";
        /// Pages per erase block.
        pages_per_block: u32 = 256, unit = "pages";
        /// Erase blocks per SSD (scaled down from a real device to keep runs short).
        blocks_per_ssd: u32 = 6400, unit = "blocks";
        /// Fraction of physical pages hidden from the host.
        overprovision_fraction: f64 = 0.127, unit = "fraction";
        /// Free blocks kept for GC; host writes wait for foreground GC below this.
        gc_reserve_blocks: u32 = 4, unit = "blocks";
        /// Victim choice: greedy, fifo or cost_benefit.
        victim: VictimPolicy = VictimPolicy::Greedy, unit = "enum";
        /// Where GC copies go: shared (one GC block) or per_stream.
        gc_placement: GcPlacement = GcPlacement::PerStream, unit = "enum";
        /// Streams each SSD supports.
        streams_max: u16 = 8, unit = "streams";
        /// Page read latency.
        page_read_us: f64 = 60.0, unit = "microseconds";
        /// Page program latency.
        page_program_us: f64 = 500.0, unit = "microseconds";
        /// Block erase latency.
        block_erase_us: f64 = 3500.0, unit = "microseconds";
        /// Dies working in parallel; under the queued model a block lives on die `block mod dies` and programs rotate over the dies.
        parallel_units: u32 = 32, unit = "dies";
        /// Time model of workloads with time (bios): queued (per-die FIFO queues, foreground GC blocks the stream that needs a block) or fluid (latency ÷ dies per operation).
        device_model: DeviceModel = DeviceModel::Queued, unit = "enum";
        /// Queued model: host programs go ahead of GC work while free blocks are above the reserve (off = foreground GC).
        gc_preemption: GcPreemption = GcPreemption::Off, unit = "enum";
        /// Stripe unit of files over SSDs.
        stripe_unit_bytes: u64 = 512 * KIB, unit = "bytes";
        /// SSDs behind the striping (one per burst buffer node).
        ssds: u16 = 4, unit = "ssds";
        /// File system discards a deleted file's blocks (online `discard`); false = they stay valid in the FTL until reused.
        trim_on_delete: bool = true, unit = "bool";
        /// File system block allocator for new file data: stack, first_fit or next_fit.
        lba_allocation: LbaAllocation = LbaAllocation::Stack, unit = "enum";
    }
}

impl FtlKnobs {
    /// The SSD configuration these knobs describe (validated).
    pub fn ssd_config(&self) -> Result<SsdConfig, SsdConfigError> {
        let mut config = SsdConfig::with_overprovisioning(
            self.blocks_per_ssd,
            self.pages_per_block,
            self.page_bytes,
            self.overprovision_fraction,
        );
        config.gc_reserve_blocks = self.gc_reserve_blocks;
        config.victim = self.victim;
        config.gc_placement = self.gc_placement;
        config.streams = self.streams_max;
        config.timing = NandTiming {
            page_read_us: self.page_read_us,
            page_program_us: self.page_program_us,
            block_erase_us: self.block_erase_us,
            parallel_units: self.parallel_units,
            device_model: self.device_model,
            gc_preemption: self.gc_preemption,
        };
        config.validate()?;
        Ok(config)
    }

    /// The file system model these knobs describe.
    pub fn file_system(&self) -> FileSystemModel {
        FileSystemModel { allocation: self.lba_allocation, trim_on_delete: self.trim_on_delete }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_make_a_valid_ssd() {
        let config = FtlKnobs::default().ssd_config().unwrap();
        assert_eq!(config.streams, 8);
        assert!(config.logical_pages < config.blocks * config.pages_per_block);
        assert!(FtlKnobs::describe().iter().all(|k| !k.doc.trim().is_empty()));
    }
}
