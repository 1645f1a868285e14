//! `spillway demo`: the store's story in one process (what `make demo` shows for now).
//!
//! Two jobs (two streams) write a multi-file checkpoint across three epochs into a store with a
//! deliberately small DRAM tier, so it spills to SSD segments; two epochs are committed, the
//! third is still being written when the store "crashes" (dropped without a clean shutdown).
//! The store is reopened, recovery is shown, every committed byte is verified, the leftover
//! epoch is deleted, the oldest epoch is marked drained and GC reclaims its segments.
//! Later issues replace this with the server + drain demo.

use anyhow::{bail, Context};
use spillway_config::StoreKnobs;
use spillway_store::{Durability, EpochPhase, Store};
use spillway_types::{format_bytes, EpochId, FileId, StreamKey, MIB};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Directory for the SSD log (default: a fresh directory under /var/tmp, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Bytes each rank writes per epoch.
    #[arg(long, default_value_t = 8 * MIB)]
    rank_bytes: u64,
}

const RANKS_PER_JOB: u64 = 4;
const JOBS: u64 = 2;
const CHUNK_BYTES: usize = 1 << 20;

/// Deterministic content of one chunk of one rank's file (so it can be verified after the crash).
fn chunk(epoch: u64, file: u64, index: u64, length: usize) -> Vec<u8> {
    let mut state = epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ file.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ index;
    let mut out = Vec::with_capacity(length);
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

fn file_id(job: u64, rank: u64) -> FileId {
    FileId(job * 100 + rank)
}

fn write_epoch(store: &Store, epoch: u64, rank_bytes: u64) -> anyhow::Result<f64> {
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..JOBS)
            .map(|job| {
                scope.spawn(move || -> anyhow::Result<()> {
                    for rank in 0..RANKS_PER_JOB {
                        let file = file_id(job, rank);
                        store.name_file(EpochId(epoch), file, &format!("job{job}/ckpt.{epoch}/rank{rank}.dat"))?;
                        for (index, offset) in (0..rank_bytes).step_by(CHUNK_BYTES).enumerate() {
                            let length = CHUNK_BYTES.min((rank_bytes - offset) as usize);
                            let data = chunk(epoch, file.0, index as u64, length);
                            store.write(StreamKey(job + 1), EpochId(epoch), file, offset, &data)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("writer panicked"))
    })?;
    Ok(started.elapsed().as_secs_f64())
}

fn verify_epoch(store: &Store, epoch: u64, rank_bytes: u64) -> anyhow::Result<u64> {
    let mut verified = 0;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    for job in 0..JOBS {
        for rank in 0..RANKS_PER_JOB {
            let file = file_id(job, rank);
            for (index, offset) in (0..rank_bytes).step_by(CHUNK_BYTES).enumerate() {
                let length = CHUNK_BYTES.min((rank_bytes - offset) as usize);
                store.read(EpochId(epoch), file, offset, &mut buffer[..length])?;
                if buffer[..length] != chunk(epoch, file.0, index as u64, length)[..] {
                    bail!("epoch {epoch} file {file} differs at offset {offset} after the crash");
                }
                verified += length as u64;
            }
        }
    }
    Ok(verified)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (directory, _temp) = match &args.dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("spillway-demo-").tempdir_in("/var/tmp")?;
            (temp.path().join("ssd"), Some(temp))
        }
    };
    let knobs = StoreKnobs {
        ssd_directory: directory.display().to_string(),
        dram_bytes_max: 16 * MIB,
        segment_bytes_max: 8 * MIB,
        record_payload_bytes_max: MIB,
        ssd_bytes_max: 1024 * MIB,
        ..StoreKnobs::default()
    };
    let epoch_bytes = JOBS * RANKS_PER_JOB * args.rank_bytes;
    println!("Spillway store demo");
    println!(
        "  SSD log {} | DRAM tier {} (spills above {}%) | segments of {} | {JOBS} jobs x {RANKS_PER_JOB} ranks, {} per rank",
        directory.display(),
        format_bytes(knobs.dram_bytes_max),
        knobs.dram_high_watermark_percent,
        format_bytes(knobs.segment_bytes_max),
        format_bytes(args.rank_bytes)
    );
    println!();
    println!("1. Checkpoint: three epochs written by both jobs (one stream per job)");
    let store = Store::open(&knobs).with_context(|| format!("opening the store in {}", directory.display()))?;
    for epoch in 1..=2 {
        let seconds = write_epoch(&store, epoch, args.rank_bytes)?;
        let commit_started = Instant::now();
        store.commit(EpochId(epoch), Durability::Ssd)?;
        let commit_ms = commit_started.elapsed().as_secs_f64() * 1e3;
        println!(
            "   epoch {epoch}: {} in {:.0} ms ({:.2} GB/s acknowledged), commit (durable on SSD) {commit_ms:.0} ms",
            format_bytes(epoch_bytes),
            seconds * 1e3,
            epoch_bytes as f64 / seconds / 1e9
        );
    }
    let seconds = write_epoch(&store, 3, args.rank_bytes)?;
    println!("   epoch 3: {} in {:.0} ms, not committed yet", format_bytes(epoch_bytes), seconds * 1e3);
    let stats = store.stats();
    println!(
        "   store: {} in DRAM, {} segments holding {} on SSD, write hints {:?}",
        format_bytes(stats.dram_used_bytes),
        stats.segments,
        format_bytes(stats.ssd_used_bytes),
        stats.write_hints
    );
    println!();
    println!("2. Crash: the store is dropped without a clean shutdown (DRAM contents lost)");
    drop(store);
    let before_crash = stats;
    println!();
    println!("3. Restart and recovery");
    let opened = Instant::now();
    let store = Store::open(&knobs)?;
    let recovery = store.stats().recovery;
    println!(
        "   scanned {} segments, {} records, {} in {:.0} ms; torn tails cut: {}; every CRC verified",
        recovery.segments_scanned,
        recovery.records_scanned,
        format_bytes(recovery.bytes_scanned),
        opened.elapsed().as_secs_f64() * 1e3,
        recovery.truncated.len()
    );
    for info in store.epochs() {
        println!(
            "   epoch {}: {:?}, {} files, {} records, {}{}",
            info.epoch,
            info.phase,
            info.files,
            info.data_records,
            format_bytes(info.payload_bytes),
            if info.recovered_uncommitted { " (uncommitted: whatever survived is whole records)" } else { "" }
        );
    }
    for epoch in 1..=2 {
        let verified = verify_epoch(&store, epoch, args.rank_bytes)?;
        let names: Vec<String> = store.files(EpochId(epoch))?.into_iter().filter_map(|f| f.name).take(2).collect();
        println!("   epoch {epoch}: {} verified bit-exact; names kept, e.g. {}", format_bytes(verified), names.join(", "));
    }
    for info in store.epochs() {
        if info.phase == EpochPhase::Open {
            store.delete_epoch(info.epoch)?;
            println!("   epoch {}: uncommitted leftover deleted (its writer restarts it)", info.epoch);
        }
    }
    println!();
    println!("4. Drain and garbage collection");
    let before = store.stats();
    store.mark_drained(EpochId(1))?;
    let report = store.gc()?;
    let compacted = store.compact_now()?;
    let after = store.stats();
    println!("   epoch 1 marked drained (it is on the PFS now): its bytes are dead");
    println!(
        "   GC (background flusher + explicit rounds) deleted {} whole dead segments since the restart;",
        after.segments_deleted
    );
    println!(
        "   this round freed {}, then compaction copied {} of live data out of {} sparse segments",
        format_bytes(report.bytes_freed + compacted.bytes_freed),
        format_bytes(compacted.bytes_copied),
        compacted.segments_compacted
    );
    println!(
        "   SSD use {} -> {} ({} live), segments {} -> {}",
        format_bytes(before.ssd_used_bytes),
        format_bytes(after.ssd_used_bytes),
        format_bytes(after.ssd_live_bytes),
        before.segments,
        after.segments
    );
    let user = before_crash.user_bytes_to_ssd + after.user_bytes_to_ssd;
    let written = before_crash.ssd_bytes_written + after.ssd_bytes_written;
    println!(
        "   host write amplification over the demo: {:.3} = {} written to SSD / {} of user records \
         (compaction {}, metadata {})",
        written as f64 / user.max(1) as f64,
        format_bytes(written),
        format_bytes(user),
        format_bytes(before_crash.compaction_bytes + after.compaction_bytes),
        format_bytes(before_crash.metadata_bytes + after.metadata_bytes)
    );
    let verified = verify_epoch(&store, 2, args.rank_bytes)?;
    println!("   epoch 2 still reads back bit-exact ({})", format_bytes(verified));
    store.close()?;
    println!();
    println!("Done: committed data survived the crash, uncommitted data was whole or absent, GC reclaimed the drained epoch.");
    Ok(())
}
