//! Sizes as users write them on the command line and in `#BB_LUA` directives.
//!
//! Binary (IEC) when the unit is a bare letter or ends in `iB`: `64M`, `64MiB`, `1G`, `1GiB` are
//! 2^20 and 2^30 multiples. Decimal (SI) when the unit ends in a plain `B`: `64MB` = 64·10^6,
//! `1GB` = 10^9 — the same reading as Slurm's burst buffer sizes. Case-insensitive; units
//! K, M, G, T, P; no unit means bytes.

/// Parses a size; the error names the text and what was expected.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(format!("{text:?} is not a size (e.g. 4096, 64MiB, 200GiB, 1G, 10GB)"));
    }
    let value: u64 = digits.parse().map_err(|_| format!("{text:?} is too large"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let (letter, binary) = match unit.as_str() {
        "" | "b" => return Ok(value),
        u if u.len() == 1 => (u, true),
        u if u.len() == 3 && u.ends_with("ib") => (&u[..1], true),
        u if u.len() == 2 && u.ends_with('b') => (&u[..1], false),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (K, M, G, T, P with optional iB or B)")),
    };
    let power = match letter {
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (K, M, G, T, P with optional iB or B)")),
    };
    let base: u64 = if binary { 1024 } else { 1000 };
    value.checked_mul(base.pow(power)).ok_or_else(|| format!("{text:?} overflows 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn iec_si_and_bare() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("200GiB"), Ok(200 << 30));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size("5kb"), Ok(5000));
        assert_eq!(parse_size("3B"), Ok(3));
        assert!(parse_size("G").is_err());
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("99999999P").unwrap_err().contains("overflows"));
        assert!(parse_size("").is_err());
    }
}
