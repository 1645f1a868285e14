//! The demo's checks of what it wrote: every rank's part read back through the client (or from
//! the PFS copy of a drained epoch), the PFS copies themselves, and the PFS writes of a shuffled
//! drain against the plan of each server's domain.

use std::path::Path;

use anyhow::{bail, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_drain::{chunk_writes, partition_domains};
use spillway_proto::{DrainInfo, Endpoint};
use spillway_types::format_bytes;

use crate::cluster::{DRAIN_STRIPE_BYTES, DRAIN_WRITE_BYTES_MAX, SERVER_NAMES};
use crate::workload::{rank_data, EpochPlan, Layout};

/// Reads every rank's part of a committed epoch back through the client and checks it; with
/// `pfs`, the client falls back to the PFS copy of a drained epoch (and must, if `drained`).
/// Returns the bytes verified and how many parts were read from the PFS copy.
pub(crate) fn verify_epoch(
    endpoints: &[Endpoint],
    plan: &EpochPlan,
    crcs: &[u32],
    transfer_bytes: u64,
    pfs: &Path,
    drained: bool,
) -> anyhow::Result<(u64, usize)> {
    let mut verified = 0;
    let mut from_pfs = 0;
    for (rank, &expected) in crcs.iter().enumerate() {
        let rank = rank as u32;
        // A reader of a local-placement file finds its pieces wherever they are.
        let placement = match plan.placement(rank) {
            Placement::Local { .. } => Placement::Local { rank: 0 },
            striped => striped,
        };
        let options = ClientOptions {
            placement,
            transfer_bytes_max: transfer_bytes,
            client_name: "demo reader".into(),
            ..ClientOptions::default()
        };
        let mut client = Client::connect(endpoints, options).context("reader: connecting")?;
        client.set_pfs_fallback(pfs);
        let name = plan.file_name(rank);
        let file = client
            .open_file(plan.epoch, &name)
            .with_context(|| format!("opening {name} of epoch {}", plan.epoch))?;
        match (file.pfs_copy(), drained) {
            (Some(_), _) => from_pfs += 1,
            (None, true) => bail!("epoch {} {name}: drained and freed, yet the client did not fall back to its PFS copy", plan.epoch),
            (None, false) => {}
        }
        let mut back = vec![0u8; plan.rank_bytes as usize];
        let offset = plan.offset(rank);
        client
            .read(&file, offset, &mut back)
            .with_context(|| format!("reading {name} of epoch {} at {offset}", plan.epoch))?;
        let got = crc32c::crc32c(&back);
        if got != expected {
            let first_bad = rank_data(plan.epoch, rank, plan.rank_bytes)
                .iter()
                .zip(&back)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            bail!(
                "epoch {} {name}: rank {rank}'s {} read back with CRC32C {got:08x}, written {expected:08x}; first differing byte at file offset {}",
                plan.epoch,
                format_bytes(plan.rank_bytes),
                offset + first_bad as u64
            );
        }
        verified += plan.rank_bytes;
    }
    Ok((verified, from_pfs))
}

/// Checks the PFS copy of a drained epoch against the CRC32C of every rank's part: the files
/// exist under their final names with the written size and content, and no staging file or part
/// marker (dot names) is left in the epoch's directory. Returns the bytes verified.
pub(crate) fn verify_pfs_copy(pfs: &Path, plan: &EpochPlan, crcs: &[u32]) -> anyhow::Result<u64> {
    let dir = pfs.join(format!("epoch-{}", plan.epoch.0));
    let ranks = crcs.len() as u32;
    let mut verified = 0;
    let mut check = |name: &str, ranks_in_file: std::ops::Range<u32>| -> anyhow::Result<()> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path)
            .with_context(|| format!("reading the PFS copy {}", path.display()))?;
        let expected_len = match plan.layout {
            Layout::FilePerRank => plan.rank_bytes,
            Layout::SharedStriped => ranks as u64 * plan.rank_bytes,
        };
        if bytes.len() as u64 != expected_len {
            bail!(
                "PFS copy {}: {} bytes, {} were written",
                path.display(),
                bytes.len(),
                expected_len
            );
        }
        for rank in ranks_in_file {
            let start = plan.offset(rank) as usize;
            let got = crc32c::crc32c(&bytes[start..start + plan.rank_bytes as usize]);
            if got != crcs[rank as usize] {
                bail!("PFS copy {}: rank {rank}'s bytes at offset {start} have CRC32C {got:08x}, written {:08x}", path.display(), crcs[rank as usize]);
            }
        }
        verified += bytes.len() as u64;
        Ok(())
    };
    match plan.layout {
        Layout::FilePerRank => {
            for rank in 0..ranks {
                check(&plan.file_name(rank), rank..rank + 1)?;
            }
        }
        Layout::SharedStriped => check(&plan.file_name(0), 0..ranks)?,
    }
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                bail!(
                    "PFS: {} left behind in {} (staging file or part marker)",
                    entry.file_name().to_string_lossy(),
                    d.display()
                );
            }
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(verified)
}

/// Each server's stripe-aligned domain of a shuffled N-1 file of `file_bytes`, shown with the
/// PFS writes the drain plan makes of it; a server that drained without a failed attempt must
/// have written exactly its domain in exactly the planned writes.
pub(crate) fn check_domain_writes(
    infos: &[(usize, DrainInfo)],
    file_bytes: u64,
) -> anyhow::Result<()> {
    let domains = partition_domains(file_bytes, infos.len(), DRAIN_STRIPE_BYTES);
    println!(
        "   domains of the {} shared file ({} participants, boundaries on {} stripes):",
        format_bytes(file_bytes),
        domains.len(),
        format_bytes(DRAIN_STRIPE_BYTES)
    );
    for ((server, info), domain) in infos.iter().zip(&domains) {
        // The writes the plan makes of this domain: at most DRAIN_WRITE_BYTES_MAX, ending on
        // stripe boundaries; the server's own counts must match it.
        let planned = chunk_writes(domain.clone(), DRAIN_WRITE_BYTES_MAX, DRAIN_STRIPE_BYTES);
        let aligned = planned
            .iter()
            .filter(|w| {
                w.start % DRAIN_STRIPE_BYTES == 0
                    && ((w.end - w.start) % DRAIN_STRIPE_BYTES == 0 || w.end == file_bytes)
            })
            .count();
        println!(
            "     {:<4} bytes [{}, {}) = {}: wrote {} in {} calls (plan: {} writes of <= {}, {} of them stripe-aligned)",
            SERVER_NAMES[*server],
            domain.start,
            domain.end,
            format_bytes(domain.end - domain.start),
            format_bytes(info.pfs_bytes_written),
            info.pfs_write_calls,
            planned.len(),
            format_bytes(DRAIN_WRITE_BYTES_MAX),
            aligned
        );
        if info.failed_attempts == 0
            && (info.pfs_bytes_written != domain.end - domain.start
                || info.pfs_write_calls != planned.len() as u64)
        {
            bail!(
                "{} wrote {} bytes in {} calls to the PFS; its domain is {} bytes in {} planned writes",
                SERVER_NAMES[*server],
                info.pfs_bytes_written,
                info.pfs_write_calls,
                domain.end - domain.start,
                planned.len()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_proto::Durability;
    use spillway_types::EpochId;

    /// The PFS check catches a wrong byte, a wrong size, a missing file and a leftover marker.
    #[test]
    fn pfs_copy_check_finds_damage() {
        let dir = tempfile::tempdir().unwrap();
        let plan = EpochPlan {
            epoch: EpochId(7),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes: 1000,
            commit: true,
        };
        let data: Vec<Vec<u8>> = (0..3).map(|r| rank_data(plan.epoch, r, 1000)).collect();
        let crcs: Vec<u32> = data.iter().map(|d| crc32c::crc32c(d)).collect();
        let path = dir.path().join("epoch-7").join(plan.file_name(0));
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("reading the PFS copy"), "{error}");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut whole = data.concat();
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(verify_pfs_copy(dir.path(), &plan, &crcs).unwrap(), 3000);
        whole[1500] ^= 1;
        std::fs::write(&path, &whole).unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("rank 1") && error.contains("offset 1000"), "{error}");
        whole[1500] ^= 1;
        std::fs::write(&path, &whole[..2999]).unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("2999 bytes"), "{error}");
        std::fs::write(&path, &whole).unwrap();
        std::fs::write(path.with_file_name(".shared.dat.spillway-e7.staging.part-0"), b"").unwrap();
        let error = verify_pfs_copy(dir.path(), &plan, &crcs).unwrap_err().to_string();
        assert!(error.contains("left behind"), "{error}");
    }
}
