//! CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320): the checksum of the trace end record.
//!
//! This variant, not CRC-32C, because Python's standard library computes it (`zlib.crc32`), so
//! the Python trace reader needs no extra dependency. Table-driven, byte at a time: traces are
//! checksummed at hundreds of MB/s, far beyond what the simulator consumes.

const POLYNOMIAL: u32 = 0xEDB8_8320;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut index = 0;
    while index < 256 {
        let mut value = index as u32;
        let mut bit = 0;
        while bit < 8 {
            value = if value & 1 != 0 { (value >> 1) ^ POLYNOMIAL } else { value >> 1 };
            bit += 1;
        }
        table[index] = value;
        index += 1;
    }
    table
};

/// Running CRC-32 state.
#[derive(Clone, Debug)]
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    pub fn new() -> Self {
        Crc32 { state: 0xFFFF_FFFF }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        let mut state = self.state;
        for &byte in bytes {
            state = TABLE[((state ^ u32::from(byte)) & 0xFF) as usize] ^ (state >> 8);
        }
        self.state = state;
    }

    pub fn finish(self) -> u32 {
        self.state ^ 0xFFFF_FFFF
    }
}

/// CRC-32 of one buffer.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = Crc32::new();
    crc.update(bytes);
    crc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|value| (value * 7) as u8).collect();
        let mut crc = Crc32::new();
        crc.update(&data[..333]);
        crc.update(&data[333..]);
        assert_eq!(crc.finish(), crc32(&data));
    }
}
