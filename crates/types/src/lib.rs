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

/// Most uids, and separately most gids, an epoch grant allows besides its owner: the bound of a
/// persistent reservation's `allowed_uids`/`allowed_gids` at the manager, of a `GrantEpoch`
/// request on the wire and of a grant record in the store's log.
pub const GRANT_ALLOWED_IDS_MAX: usize = 256;

/// Longest failure domain name (`server.failure_domain`), in bytes.
pub const FAILURE_DOMAIN_BYTES_MAX: usize = 64;

/// Whether `name` is a valid failure domain: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most
/// [`FAILURE_DOMAIN_BYTES_MAX`] bytes. Domains are compared as exact strings (a host's name),
/// so they are kept to characters that print and compare unambiguously.
pub fn is_failure_domain(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= FAILURE_DOMAIN_BYTES_MAX
        && bytes[0].is_ascii_alphanumeric()
        && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

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

/// Why a size did not parse (see [`parse_size`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// No leading digits.
    NoDigits,
    /// A unit other than K, M, G, T, P with an optional `iB`/`B` (the unit as written).
    UnknownUnit(String),
    /// More than 2^64 - 1 bytes.
    Overflow,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeError::NoDigits => write!(f, "no digits (e.g. 4096, 64M, 64MiB, 200GiB, 10GB)"),
            SizeError::UnknownUnit(unit) => {
                write!(f, "unknown unit {unit:?} (K, M, G, T, P with an optional iB or B)")
            }
            SizeError::Overflow => write!(f, "more than 2^64 bytes"),
        }
    }
}

impl std::error::Error for SizeError {}

/// The one reading of sizes on command lines, in `#BB_LUA` directives and in the manager's API:
/// digits, then an optional unit, case-insensitive. A bare letter or `iB` is binary (`64M` =
/// `64MiB` = 64·2^20); a plain `B` after the letter is decimal (`10GB` = 10^10), as Slurm reads
/// burst buffer sizes; `B` or nothing means bytes. Surrounding whitespace is ignored.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::NoDigits);
    }
    let value: u64 = digits.parse().map_err(|_| SizeError::Overflow)?;
    let lower = unit.trim().to_ascii_lowercase();
    let (letter, binary) = match lower.as_str() {
        "" | "b" => return Ok(value),
        u if u.len() == 1 => (u, true),
        u if u.len() == 3 && u.ends_with("ib") => (&u[..1], true),
        u if u.len() == 2 && u.ends_with('b') => (&u[..1], false),
        _ => return Err(SizeError::UnknownUnit(unit.to_string())),
    };
    let power = match letter {
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => return Err(SizeError::UnknownUnit(unit.to_string())),
    };
    let base: u64 = if binary { 1024 } else { 1000 };
    value.checked_mul(base.pow(power)).ok_or(SizeError::Overflow)
}

/// Unix seconds as `YYYY-MM-DD HH:MM UTC` (the proleptic Gregorian calendar; days to civil
/// date by Howard Hinnant's algorithm), for tables that show when something happened.
pub fn format_unix_utc(unix_s: u64) -> String {
    let (days, seconds) = ((unix_s / 86_400) as i64, unix_s % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", seconds / 3600, seconds % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_seconds_format_as_utc_dates() {
        assert_eq!(format_unix_utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(format_unix_utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(format_unix_utc(1_795_914_728), "2026-11-29 01:12 UTC");
        assert_eq!(format_unix_utc(4_107_542_399), "2100-02-28 23:59 UTC");
    }

    #[test]
    fn sizes_binary_decimal_and_bare() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size(" 1G "), Ok(1 << 30));
        assert_eq!(parse_size("200GiB"), Ok(200 << 30));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size("5kb"), Ok(5000));
        assert_eq!(parse_size("3B"), Ok(3));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").is_err());
        assert_eq!(parse_size("G"), Err(SizeError::NoDigits));
        assert_eq!(parse_size(""), Err(SizeError::NoDigits));
        assert_eq!(parse_size("12XB"), Err(SizeError::UnknownUnit("XB".into())));
        assert_eq!(parse_size("99999999P"), Err(SizeError::Overflow));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::Overflow));
    }

    #[test]
    fn format_bytes_picks_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 * GIB), "3.0 GiB");
    }

    #[test]
    fn failure_domains_are_checked() {
        for good in ["node1", "a", "n-1.rack_2", &"x".repeat(FAILURE_DOMAIN_BYTES_MAX)] {
            assert!(is_failure_domain(good), "{good}");
        }
        for bad in ["", "-n", ".n", "a b", "a/b", "é", &"x".repeat(FAILURE_DOMAIN_BYTES_MAX + 1)] {
            assert!(!is_failure_domain(bad), "{bad}");
        }
    }

    #[test]
    fn ids_order_numerically() {
        assert!(EpochId(2) < EpochId(10));
        assert_eq!(FileId(7).to_string(), "7");
    }
}
