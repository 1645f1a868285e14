//! Identifiers and units shared by every Spillway crate.
//!
//! Leaf crate: no I/O, no clocks, no allocation policy. Newtypes keep an epoch id from being
//! passed where a file id is expected; all are `Copy` and ordered because the index sorts by them.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A checkpoint epoch (BurstMem's "timestamp"): the unit of commit, drain and GC.
    EpochId(u64)
);
id_type!(
    /// A file inside an epoch. Assigned by whoever names files (client or mount); the store
    /// treats it as opaque.
    FileId(u64)
);
id_type!(
    /// A placement group (user or job, BIOS I/O separation). One stream never shares a segment
    /// with another.
    StreamKey(u64)
);
id_type!(
    /// A segment file of the SSD log.
    SegmentId(u64)
);

/// Byte-count helpers; knobs are declared in bytes and these keep literals readable.
pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// Formats a byte count for humans (binary units).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_bytes_picks_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 * GIB), "3.0 GiB");
    }

    #[test]
    fn ids_order_numerically() {
        assert!(EpochId(2) < EpochId(10));
        assert_eq!(FileId(7).to_string(), "7");
    }
}
