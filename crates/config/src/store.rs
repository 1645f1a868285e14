//! Knobs of the log-structured store. Owned by the store; validated here.

use crate::{knobs, ConfigError};
use spillway_types::MIB;

knobs! {
    /// The log-structured store of one burst buffer server.
    section "store";
    pub struct StoreKnobs {
        /// Directory holding the SSD log segments.
        ssd_directory: String = "/var/lib/spillway/ssd".to_string(), unit = "path";
        /// Capacity of the DRAM log.
        dram_bytes_max: u64 = 1024 * MIB, unit = "bytes";
        /// Capacity of the SSD log (all segments together).
        ssd_bytes_max: u64 = 64 * 1024 * MIB, unit = "bytes";
    }
}

impl StoreKnobs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dram_bytes_max == 0 {
            return Err(ConfigError::Invalid {
                section: Self::SECTION,
                name: "dram_bytes_max",
                value: "0".into(),
                reason: "the DRAM log needs some capacity".into(),
            });
        }
        Ok(())
    }
}
