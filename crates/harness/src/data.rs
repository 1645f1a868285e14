//! Deterministic test data: every process agrees on the bytes without shipping them around.

/// Deterministic bytes for (seed, length): xorshift64, so every test and every process agrees on
/// the content without shipping it around.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(length);
    while out.len() < length {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// Same length, same CRC32C and same bytes (the CRC is what a drain or a store would check).
pub fn same_bytes(got: &[u8], expected: &[u8]) -> bool {
    got.len() == expected.len()
        && crc32c::crc32c(got) == crc32c::crc32c(expected)
        && got == expected
}

/// Every regular file under `dir` (symbolic links not followed), in no particular order: what a
/// test checks was left behind.
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(entry.path()),
                Ok(kind) if kind.is_file() => files.push(entry.path()),
                _ => {}
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seed_dependent() {
        assert_eq!(pattern(7, 1001), pattern(7, 1001));
        assert_eq!(pattern(7, 1001).len(), 1001);
        assert_eq!(pattern(7, 1001)[..500], pattern(7, 500)[..]);
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert!(same_bytes(&pattern(3, 4097), &pattern(3, 4097)));
        assert!(!same_bytes(&pattern(3, 4097), &pattern(3, 4096)));
    }
}
