//! What the ranks write: the plans of the demo's epochs (layout, placement, durability), each
//! rank's deterministic bytes, and the two ways of writing them that step 2 compares (through
//! spillway, and straight to files on disk).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use spillway_client::{Client, ClientOptions, Placement};
use spillway_proto::{Durability, Endpoint};
use spillway_types::{format_bytes, EpochId, MIB};

/// How the ranks of one epoch lay out their data.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// N-N: a file per rank, each rank writing to its own server (`local` placement).
    FilePerRank,
    /// N-1: one shared file, rank `r` writes bytes `[r·B, (r+1)·B)`, striped over every server.
    SharedStriped,
}

#[derive(Clone, Copy)]
pub(crate) struct EpochPlan {
    pub(crate) epoch: EpochId,
    pub(crate) layout: Layout,
    pub(crate) durability: Durability,
    /// Bytes per rank.
    pub(crate) rank_bytes: u64,
    pub(crate) commit: bool,
}

const STRIPE_UNIT_BYTES: u64 = MIB;

impl EpochPlan {
    pub(crate) fn file_name(&self, rank: u32) -> String {
        match self.layout {
            Layout::FilePerRank => format!("ckpt.{}/rank{rank}.dat", self.epoch.0),
            Layout::SharedStriped => format!("ckpt.{}/shared.dat", self.epoch.0),
        }
    }

    pub(crate) fn offset(&self, rank: u32) -> u64 {
        match self.layout {
            Layout::FilePerRank => 0,
            Layout::SharedStriped => rank as u64 * self.rank_bytes,
        }
    }

    pub(crate) fn placement(&self, rank: u32) -> Placement {
        match self.layout {
            Layout::FilePerRank => Placement::Local { rank },
            Layout::SharedStriped => {
                Placement::Striped { stripe_unit_bytes: STRIPE_UNIT_BYTES, stripe_count: u32::MAX }
            }
        }
    }

    pub(crate) fn describe(&self, ranks: u32) -> String {
        let what = match self.layout {
            Layout::FilePerRank => format!("N-N, {ranks} files, local placement"),
            Layout::SharedStriped => {
                format!("N-1, 1 shared file, striped {} units", format_bytes(STRIPE_UNIT_BYTES))
            }
        };
        let durability = match (self.commit, self.durability) {
            (false, _) => "not committed".to_string(),
            (true, Durability::Memory) => "commit durability memory".to_string(),
            (true, Durability::Ssd) => "commit durability ssd".to_string(),
            (true, other) => format!("commit durability {other:?}"),
        };
        format!("epoch {} ({what}, {durability})", self.epoch.0)
    }
}

/// Deterministic content of one rank's part of one epoch.
pub(crate) fn rank_data(epoch: EpochId, rank: u32, length: u64) -> Vec<u8> {
    let mut state = (epoch.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        | 1;
    let mut out = Vec::with_capacity(length as usize + 8);
    while (out.len() as u64) < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length as usize);
    out
}

/// Epochs 1 to 3, checkpointed and committed in step 2: N-N at `memory` and at `ssd`
/// durability, then N-1 at `ssd` durability.
pub(crate) fn checkpoint_plans(rank_bytes: u64) -> [EpochPlan; 3] {
    [
        EpochPlan {
            epoch: EpochId(1),
            layout: Layout::FilePerRank,
            durability: Durability::Memory,
            rank_bytes,
            commit: true,
        },
        EpochPlan {
            epoch: EpochId(2),
            layout: Layout::FilePerRank,
            durability: Durability::Ssd,
            rank_bytes,
            commit: true,
        },
        EpochPlan {
            epoch: EpochId(3),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes,
            commit: true,
        },
    ]
}

/// Epoch 4: written while epoch 3 drains, never committed (step 5 crashes a server under it).
pub(crate) fn open_plan(rank_bytes: u64) -> EpochPlan {
    EpochPlan {
        epoch: EpochId(4),
        layout: Layout::FilePerRank,
        durability: Durability::Ssd,
        rank_bytes,
        commit: false,
    }
}

/// Every rank's bytes of one epoch, rank 0 first.
pub(crate) fn plan_data(plan: &EpochPlan, ranks: u32) -> Vec<Vec<u8>> {
    (0..ranks).map(|rank| rank_data(plan.epoch, rank, plan.rank_bytes)).collect()
}

/// What the application saw while checkpointing one epoch.
pub(crate) struct CheckpointTiming {
    /// When the first rank started writing.
    pub(crate) started: Instant,
    /// When the last rank's commit returned (end of the write phase if not committed).
    pub(crate) finished: Instant,
    /// First write to the last rank's last write acknowledged (in the servers' DRAM).
    pub(crate) write: Duration,
    /// From the end of the write phase to the last rank's commit returning.
    pub(crate) commit: Duration,
}

impl CheckpointTiming {
    pub(crate) fn total(&self) -> Duration {
        self.write + self.commit
    }
}

/// Runs one epoch's ranks as threads: connect, barrier, write + flush, barrier, commit.
pub(crate) fn write_checkpoint(
    endpoints: &[Endpoint],
    plan: &EpochPlan,
    data: &[Vec<u8>],
    transfer_bytes: u64,
) -> anyhow::Result<CheckpointTiming> {
    let ranks = data.len();
    let barrier = Barrier::new(ranks);
    let results: Vec<anyhow::Result<(Instant, Instant, Instant)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let rank = rank as u32;
                    let options = ClientOptions {
                        placement: plan.placement(rank),
                        durability: plan.durability,
                        transfer_bytes_max: transfer_bytes,
                        client_name: format!("demo rank {rank}"),
                        ..ClientOptions::default()
                    };
                    // Every rank passes both barriers even after a failure, so none waits forever.
                    let connected = Client::connect(endpoints, options)
                        .with_context(|| format!("rank {rank}: connecting"));
                    barrier.wait();
                    let started = Instant::now();
                    let written = connected.and_then(|mut client| {
                        client.begin_epoch(plan.epoch);
                        let name = plan.file_name(rank);
                        let mut file = client
                            .create_file(plan.epoch, &name)
                            .with_context(|| format!("rank {rank}: creating {name}"))?;
                        let base = plan.offset(rank);
                        for (i, chunk) in bytes.chunks(transfer_bytes as usize).enumerate() {
                            let offset = base + i as u64 * transfer_bytes;
                            client.write(&mut file, offset, chunk).with_context(|| {
                                format!("rank {rank}: writing {name} at {offset}")
                            })?;
                        }
                        client.flush().with_context(|| format!("rank {rank}: writes of {name}"))?;
                        Ok(client)
                    });
                    let write_done = Instant::now();
                    barrier.wait();
                    let mut client = written?;
                    if plan.commit {
                        client.commit_epoch(plan.epoch).with_context(|| {
                            format!("rank {rank}: committing epoch {}", plan.epoch)
                        })?;
                    }
                    Ok((started, write_done, Instant::now()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a rank thread panicked"))))
            .collect()
    });
    let times = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let start = times.iter().map(|t| t.0).min().expect("at least one rank");
    let written = times.iter().map(|t| t.1).max().expect("at least one rank");
    let committed = times.iter().map(|t| t.2).max().expect("at least one rank");
    Ok(CheckpointTiming {
        started: start,
        finished: committed.max(written),
        write: written - start,
        commit: committed.saturating_duration_since(written),
    })
}

/// The same bytes written straight to a directory on disk: N-N as a file per rank, N-1 as one
/// shared file with positioned writes; every rank fsyncs its file. Returns the elapsed time.
pub(crate) fn write_direct(
    dir: &Path,
    plan: &EpochPlan,
    data: &[Vec<u8>],
    transfer_bytes: u64,
) -> anyhow::Result<Duration> {
    let dir = dir.join(format!("epoch{}", plan.epoch.0));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if plan.layout == Layout::SharedStriped {
        File::create(dir.join("shared.dat"))
            .with_context(|| format!("creating {}/shared.dat", dir.display()))?;
    }
    let started = Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                let dir = &dir;
                scope.spawn(move || -> anyhow::Result<()> {
                    let rank = rank as u32;
                    let path = match plan.layout {
                        Layout::FilePerRank => dir.join(format!("rank{rank}.dat")),
                        Layout::SharedStriped => dir.join("shared.dat"),
                    };
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .truncate(false)
                        .open(&path)?;
                    let base = plan.offset(rank);
                    for (i, chunk) in bytes.chunks(transfer_bytes as usize).enumerate() {
                        file.write_all_at(chunk, base + i as u64 * transfer_bytes)
                            .with_context(|| format!("writing {}", path.display()))?;
                    }
                    file.sync_all().with_context(|| format!("fsync of {}", path.display()))?;
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| Err(anyhow!("a direct-write thread panicked")))
        })
    })?;
    let elapsed = started.elapsed();
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_data_is_deterministic_and_distinct() {
        assert_eq!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(1), 0, 1000));
        assert_ne!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(1), 1, 1000));
        assert_ne!(rank_data(EpochId(1), 0, 1000), rank_data(EpochId(2), 0, 1000));
        assert_eq!(rank_data(EpochId(3), 2, 13).len(), 13);
    }

    #[test]
    fn n_1_ranks_write_disjoint_ranges_of_one_file() {
        let plan = EpochPlan {
            epoch: EpochId(3),
            layout: Layout::SharedStriped,
            durability: Durability::Ssd,
            rank_bytes: 100,
            commit: true,
        };
        assert_eq!(plan.file_name(0), plan.file_name(3));
        assert_eq!((0..4).map(|r| plan.offset(r)).collect::<Vec<_>>(), vec![0, 100, 200, 300]);
        let nn = EpochPlan { layout: Layout::FilePerRank, ..plan };
        assert_ne!(nn.file_name(0), nn.file_name(1));
        assert_eq!(nn.offset(2), 0);
        assert_eq!(nn.placement(2), Placement::Local { rank: 2 });
    }
}
