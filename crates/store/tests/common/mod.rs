//! Shared helpers of the store's integration tests: small knobs that force spills, segment
//! rolls and GC, and deterministic payloads.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_config::StoreKnobs;
use spillway_types::KIB;

/// Tiny tiers: 256 KiB of DRAM, 64 KiB segments, 8 MiB of SSD, 16 KiB records.
pub fn small_knobs() -> StoreKnobs {
    StoreKnobs {
        ssd_directory: String::new(),
        dram_bytes_max: 256 * KIB,
        ssd_bytes_max: 8 * 1024 * KIB,
        segment_bytes_max: 64 * KIB,
        record_payload_bytes_max: 16 * KIB,
        dram_prefault: false,
        flusher_interval_ms: 5,
        dram_wait_ms_max: 10_000,
        ..StoreKnobs::default()
    }
}

/// Deterministic bytes for (seed, length).
pub fn payload(seed: u64, length: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![0u8; length];
    rng.fill(&mut out[..]);
    out
}

/// The seed for a randomized test: `SPILLWAY_TEST_SEED` if set (replay), else fresh.
pub fn seed(name: &str) -> u64 {
    let seed = match std::env::var("SPILLWAY_TEST_SEED") {
        Ok(value) => value.parse().expect("SPILLWAY_TEST_SEED must be a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("{name}: seed {seed} (replay with SPILLWAY_TEST_SEED={seed})");
    seed
}
