//! Interference-aware tiering (IAS): which tier an I/O phase writes to, and which drains may run
//! over the PFS now.
//!
//! A job's I/O phase (first write after quiet, up to its commit) goes to one of three tiers:
//! the compute node's own NVM ([`Tier::NodeLocal`]), the shared burst buffer
//! ([`Tier::BurstBuffer`]) or the PFS ([`Tier::Pfs`]). [`choose_tier`] is the data scheduler of
//! IAS section III-C, one strategy per [`Strategy`]: `baseline` (always the PFS),
//! `high-priority` (always the burst buffer, DataWarp's default), `interference-aware` (IAS
//! Algorithm 1: the burst buffer while fewer than N/2 jobs use it, else the PFS while fewer than
//! N/2 jobs use it, else node-local; N = active jobs) and `measured`, Spillway's own: the shared
//! tier whose observed bandwidth and queue finish the phase first, node-local only when both
//! shared tiers would take at least [`NODE_LOCAL_GAIN_MIN`] times as long as the local device.
//!
//! [`next_drains`] is the cross-job drain scheduler: drains of every reservation queue for the
//! PFS, which admits at most `pfs_streams_max` users at once, jobs' own PFS phases counted first,
//! so draining never pushes the PFS past its limit nor starts while jobs' direct PFS phases fill
//! it; waiting drains go out in order of urgency (a burst buffer that is filling up), then age.
//!
//! Pure: the client library (the runtime's decision at a phase's start), the manager (drain
//! slots, the strategy a reservation asked for) and the simulator (`spillway sim ias`) call the
//! same functions with the same snapshots, so the simulator predicts what the daemon does.

use serde::{Deserialize, Serialize};

/// Where a phase's bytes go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The compute node's own device: a local log, moved on when a shared tier is idle.
    NodeLocal,
    /// The shared burst buffer servers of the reservation.
    BurstBuffer,
    /// The parallel file system, written directly.
    Pfs,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::NodeLocal, Tier::BurstBuffer, Tier::Pfs];

    pub fn name(self) -> &'static str {
        match self {
            Tier::NodeLocal => "node-local",
            Tier::BurstBuffer => "burst-buffer",
            Tier::Pfs => "pfs",
        }
    }

    pub fn parse(text: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.name() == text)
    }
}

/// The data scheduler's strategy (a reservation's `tiering=`; the site sets the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No burst buffer: every phase writes the PFS (IAS's baseline).
    Baseline,
    /// Every phase writes the burst buffer, which drains to the PFS (IAS's "high-level
    /// priority", DataWarp's default, and Spillway's behaviour without tiering).
    HighPriority,
    /// IAS Algorithm 1, by counts of concurrent jobs per shared tier.
    InterferenceAware,
    /// By observed tier bandwidth and queued bytes (see [`choose_tier`]).
    Measured,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Baseline,
        Strategy::HighPriority,
        Strategy::InterferenceAware,
        Strategy::Measured,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Baseline => "baseline",
            Strategy::HighPriority => "high-priority",
            Strategy::InterferenceAware => "interference-aware",
            Strategy::Measured => "measured",
        }
    }

    pub fn parse(text: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|strategy| strategy.name() == text)
    }
}

/// One shared tier as the manager last saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierLoad {
    /// Jobs in an I/O phase on this tier now (Algorithm 1's `ConcurrentAccessOn…`). Drains
    /// and node-local moves are not jobs: they are background traffic that [`next_drains`]
    /// and [`node_local_move_now`] hold back while jobs use the tier (IAS Fig. 4(c): the
    /// burst buffer flushes while its writer computes).
    pub concurrent_jobs: u32,
    /// Bytes the tier still has to absorb (phases in progress, announced; where known, running
    /// drains and moves): its queue.
    pub queued_bytes: u64,
    /// Aggregate bandwidth observed on the tier, bytes per second (the manager's moving
    /// average over finished phases); 0: not measured yet.
    pub bandwidth_bytes_per_s: u64,
}

/// What the data scheduler knows when a phase starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSnapshot {
    /// Jobs active on the system (N of Algorithm 1), including the one asking.
    pub active_jobs: u32,
    pub burst_buffer: TierLoad,
    pub pfs: TierLoad,
}

/// The asking job's own view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseRequest {
    /// Bytes the phase is expected to write (the job's previous phase; 0: unknown).
    pub expected_bytes: u64,
    /// Free bytes of this node's local tier (0: none configured, or full).
    pub node_local_free_bytes: u64,
    /// The local device's bandwidth, bytes per second (0: unknown).
    pub node_local_bandwidth_bytes_per_s: u64,
}

/// How much faster node-local must be than the best shared tier before `measured` uses it:
/// data on one node is unprotected until moved, and the move costs a shared tier later.
pub const NODE_LOCAL_GAIN_MIN: u64 = 2;

/// Phase size assumed by `measured` when the job has not finished a phase yet.
pub const EXPECTED_PHASE_BYTES_DEFAULT: u64 = 256 << 20;

/// Which rule decided (for logs, tests and the simulator's report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierChoice {
    /// The strategy names one tier whatever the load (baseline, high-priority).
    Fixed(Tier),
    /// Algorithm 1 line 5: the burst buffer has fewer than N/2 concurrent jobs.
    BurstBufferBelowHalf,
    /// Algorithm 1 line 9: the burst buffer is busy, the PFS has fewer than N/2.
    PfsBelowHalf,
    /// Algorithm 1 line 13: both shared tiers busy.
    BothBusy,
    /// `measured`: the shared tier expected to finish the phase first.
    FastestShared(Tier),
    /// `measured`: both shared tiers at least [`NODE_LOCAL_GAIN_MIN`] times slower than local.
    SharedCongested,
    /// Node-local was chosen but has no room: the shared tier the rule ranks next.
    NodeLocalFull(Tier),
    /// `measured` without any bandwidth observed yet: Algorithm 1's answer.
    Unmeasured(Tier),
}

impl TierChoice {
    pub fn tier(self) -> Tier {
        match self {
            TierChoice::Fixed(tier)
            | TierChoice::FastestShared(tier)
            | TierChoice::NodeLocalFull(tier)
            | TierChoice::Unmeasured(tier) => tier,
            TierChoice::BurstBufferBelowHalf => Tier::BurstBuffer,
            TierChoice::PfsBelowHalf => Tier::Pfs,
            TierChoice::BothBusy | TierChoice::SharedCongested => Tier::NodeLocal,
        }
    }
}

/// The destination of a phase that starts now.
pub fn choose_tier(
    strategy: Strategy,
    snapshot: &TierSnapshot,
    request: &PhaseRequest,
) -> TierChoice {
    match strategy {
        Strategy::Baseline => TierChoice::Fixed(Tier::Pfs),
        Strategy::HighPriority => TierChoice::Fixed(Tier::BurstBuffer),
        Strategy::InterferenceAware => interference_aware(snapshot, request),
        Strategy::Measured => measured(snapshot, request),
    }
}

/// Algorithm 1. "Fewer than N/2" is `2 × concurrent < N`, exact for odd N: with N = 3 one job
/// may use a tier (1 < 1.5), two may not.
fn interference_aware(snapshot: &TierSnapshot, request: &PhaseRequest) -> TierChoice {
    let below_half = |load: &TierLoad| {
        2 * u64::from(load.concurrent_jobs) < u64::from(snapshot.active_jobs.max(1))
    };
    if below_half(&snapshot.burst_buffer) {
        TierChoice::BurstBufferBelowHalf
    } else if below_half(&snapshot.pfs) {
        TierChoice::PfsBelowHalf
    } else if request.node_local_free_bytes >= request.expected_bytes.max(1) {
        TierChoice::BothBusy
    } else {
        // No room on the node: the less crowded shared tier, the burst buffer on a tie.
        let tier = if snapshot.pfs.concurrent_jobs < snapshot.burst_buffer.concurrent_jobs {
            Tier::Pfs
        } else {
            Tier::BurstBuffer
        };
        TierChoice::NodeLocalFull(tier)
    }
}

/// Seconds (as a rational: numerator bytes, denominator bytes/s) for the phase on a shared
/// tier: its queue plus this phase, at its observed bandwidth. `None` when not measured.
fn finish_time_ms(load: &TierLoad, bytes: u64) -> Option<u64> {
    (load.bandwidth_bytes_per_s > 0).then(|| {
        let total = u128::from(load.queued_bytes) + u128::from(bytes);
        (total * 1000 / u128::from(load.bandwidth_bytes_per_s)).min(u128::from(u64::MAX)) as u64
    })
}

fn measured(snapshot: &TierSnapshot, request: &PhaseRequest) -> TierChoice {
    let bytes = if request.expected_bytes == 0 {
        EXPECTED_PHASE_BYTES_DEFAULT
    } else {
        request.expected_bytes
    };
    let on_bb = finish_time_ms(&snapshot.burst_buffer, bytes);
    let on_pfs = finish_time_ms(&snapshot.pfs, bytes);
    let (tier, best_ms) = match (on_bb, on_pfs) {
        (Some(bb), Some(pfs)) if pfs < bb => (Tier::Pfs, pfs),
        (Some(bb), _) => (Tier::BurstBuffer, bb),
        // The burst buffer not measured yet: counts decide, as in Algorithm 1.
        (None, _) => return TierChoice::Unmeasured(interference_aware(snapshot, request).tier()),
    };
    let local_ms = finish_time_ms(
        &TierLoad {
            bandwidth_bytes_per_s: request.node_local_bandwidth_bytes_per_s,
            ..TierLoad::default()
        },
        bytes,
    );
    match local_ms {
        Some(local) if best_ms >= local.saturating_mul(NODE_LOCAL_GAIN_MIN).max(1) => {
            if request.node_local_free_bytes >= bytes {
                TierChoice::SharedCongested
            } else {
                TierChoice::NodeLocalFull(tier)
            }
        }
        _ => TierChoice::FastestShared(tier),
    }
}

/// Whether node-local data should move to the burst buffer now: it is below half of the active
/// jobs, Algorithm 1's test for "not busy", so a move does not add a job's worth of contention
/// to a crowded buffer. Moves go to the burst buffer, whose drain publishes on the PFS.
pub fn node_local_move_now(snapshot: &TierSnapshot) -> bool {
    2 * u64::from(snapshot.burst_buffer.concurrent_jobs) < u64::from(snapshot.active_jobs.max(1))
}

/// A drain waiting for the PFS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainWait {
    /// Order of arrival (smaller: older).
    pub queued_seq: u64,
    /// How full the drain's burst buffer servers are, per mille (a filling buffer drains first:
    /// it is about to stall its writers).
    pub burst_buffer_fill_permille: u32,
}

/// Fill above which a waiting drain is urgent: it goes before older drains and may start
/// while jobs' PFS phases are running (within the limit), since stalling the buffer would
/// stall every job writing to it.
pub const URGENT_FILL_PERMILLE: u32 = 900;

/// Which waiting drains start now (indices into `waiting`, in start order). The PFS takes at
/// most `pfs_streams_max` writers; `pfs_phase_jobs` jobs writing it directly and
/// `drains_running` drains hold slots already. While jobs have PFS phases running, only urgent
/// drains start, so draining does not slow down the jobs' own I/O. Never returns more than the
/// free slots.
pub fn next_drains(
    waiting: &[DrainWait],
    drains_running: u32,
    pfs_phase_jobs: u32,
    pfs_streams_max: u32,
) -> Vec<usize> {
    let limit = pfs_streams_max.max(1);
    let free = limit.saturating_sub(drains_running.saturating_add(pfs_phase_jobs)) as usize;
    let mut order: Vec<usize> = (0..waiting.len()).collect();
    order.sort_by_key(|&i| {
        let wait = &waiting[i];
        (wait.burst_buffer_fill_permille < URGENT_FILL_PERMILLE, wait.queued_seq)
    });
    order
        .into_iter()
        .filter(|&i| {
            pfs_phase_jobs == 0 || waiting[i].burst_buffer_fill_permille >= URGENT_FILL_PERMILLE
        })
        .take(free)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(concurrent_jobs: u32) -> TierLoad {
        TierLoad { concurrent_jobs, ..TierLoad::default() }
    }

    fn snapshot(active_jobs: u32, bb: u32, pfs: u32) -> TierSnapshot {
        TierSnapshot { active_jobs, burst_buffer: load(bb), pfs: load(pfs) }
    }

    const ROOM: PhaseRequest = PhaseRequest {
        expected_bytes: 1 << 20,
        node_local_free_bytes: 1 << 30,
        node_local_bandwidth_bytes_per_s: 0,
    };
    const NO_ROOM: PhaseRequest = PhaseRequest {
        expected_bytes: 1 << 20,
        node_local_free_bytes: 0,
        node_local_bandwidth_bytes_per_s: 0,
    };

    #[test]
    fn algorithm_1_every_branch() {
        use TierChoice::*;
        // (N, jobs on BB, jobs on PFS, node-local room?) → decision.
        let table: &[(u32, u32, u32, bool, TierChoice)] = &[
            // Line 5: BB below N/2.
            (1, 0, 0, true, BurstBufferBelowHalf),
            (2, 0, 0, true, BurstBufferBelowHalf),
            (4, 1, 0, true, BurstBufferBelowHalf),
            (5, 2, 2, true, BurstBufferBelowHalf), // 2 < 2.5
            // Line 9: BB at N/2, PFS below.
            (2, 1, 0, true, PfsBelowHalf),
            (4, 2, 1, true, PfsBelowHalf),
            (3, 2, 1, true, PfsBelowHalf), // 1 < 1.5
            // Line 13: both at or above N/2.
            (2, 1, 1, true, BothBusy),
            (4, 2, 2, true, BothBusy),
            (3, 2, 2, true, BothBusy),
            (8, 5, 4, true, BothBusy),
            // Line 13 without room on the node: the less crowded shared tier, BB on a tie.
            (2, 1, 1, false, NodeLocalFull(Tier::BurstBuffer)),
            (8, 6, 4, false, NodeLocalFull(Tier::Pfs)),
            // N = 0 (the asker not yet counted) behaves as N = 1.
            (0, 0, 0, true, BurstBufferBelowHalf),
        ];
        for &(n, bb, pfs, room, want) in table {
            let request = if room { ROOM } else { NO_ROOM };
            let got = choose_tier(Strategy::InterferenceAware, &snapshot(n, bb, pfs), &request);
            assert_eq!(got, want, "N={n} bb={bb} pfs={pfs} room={room}");
        }
    }

    #[test]
    fn fixed_strategies_ignore_load() {
        for s in [snapshot(1, 0, 0), snapshot(8, 8, 8)] {
            assert_eq!(choose_tier(Strategy::Baseline, &s, &NO_ROOM).tier(), Tier::Pfs);
            assert_eq!(choose_tier(Strategy::HighPriority, &s, &NO_ROOM).tier(), Tier::BurstBuffer);
        }
    }

    fn measured_snapshot(bb_bw: u64, bb_queue: u64, pfs_bw: u64, pfs_queue: u64) -> TierSnapshot {
        TierSnapshot {
            active_jobs: 2,
            burst_buffer: TierLoad {
                concurrent_jobs: 1,
                queued_bytes: bb_queue,
                bandwidth_bytes_per_s: bb_bw,
            },
            pfs: TierLoad {
                concurrent_jobs: 0,
                queued_bytes: pfs_queue,
                bandwidth_bytes_per_s: pfs_bw,
            },
        }
    }

    #[test]
    fn measured_picks_the_tier_that_finishes_first() {
        const MB: u64 = 1 << 20;
        let request = PhaseRequest { expected_bytes: 100 * MB, ..ROOM };
        // Idle BB at 1000 MB/s beats an idle PFS at 100 MB/s.
        let s = measured_snapshot(1000 * MB, 0, 100 * MB, 0);
        assert_eq!(
            choose_tier(Strategy::Measured, &s, &request),
            TierChoice::FastestShared(Tier::BurstBuffer)
        );
        // 2 GB queued on the BB: 2.1 s there, 1 s on the PFS.
        let s = measured_snapshot(1000 * MB, 2000 * MB, 100 * MB, 0);
        assert_eq!(
            choose_tier(Strategy::Measured, &s, &request),
            TierChoice::FastestShared(Tier::Pfs)
        );
        // Both congested, a local device at 1000 MB/s: node-local (0.1 s vs ≥ 2.1 s).
        let fast_local = PhaseRequest { node_local_bandwidth_bytes_per_s: 1000 * MB, ..request };
        let s = measured_snapshot(1000 * MB, 2000 * MB, 100 * MB, 1000 * MB);
        assert_eq!(choose_tier(Strategy::Measured, &s, &fast_local), TierChoice::SharedCongested);
        // … but not when the node has no room for the phase.
        let full = PhaseRequest { node_local_free_bytes: 10 * MB, ..fast_local };
        assert_eq!(
            choose_tier(Strategy::Measured, &s, &full),
            TierChoice::NodeLocalFull(Tier::BurstBuffer)
        );
        // Less than twice as slow as local: stay shared.
        let s = measured_snapshot(1000 * MB, 50 * MB, 100 * MB, 1000 * MB);
        assert_eq!(
            choose_tier(Strategy::Measured, &s, &fast_local),
            TierChoice::FastestShared(Tier::BurstBuffer)
        );
    }

    #[test]
    fn measured_without_observations_falls_back_to_algorithm_1() {
        let s = snapshot(2, 1, 0);
        assert_eq!(choose_tier(Strategy::Measured, &s, &ROOM), TierChoice::Unmeasured(Tier::Pfs));
        let s = snapshot(2, 0, 0);
        assert_eq!(
            choose_tier(Strategy::Measured, &s, &ROOM),
            TierChoice::Unmeasured(Tier::BurstBuffer)
        );
    }

    #[test]
    fn node_local_moves_wait_for_a_quiet_burst_buffer() {
        assert!(node_local_move_now(&snapshot(1, 0, 0)));
        assert!(node_local_move_now(&snapshot(0, 0, 0)));
        assert!(node_local_move_now(&snapshot(3, 1, 3)));
        assert!(!node_local_move_now(&snapshot(2, 1, 0)));
        assert!(!node_local_move_now(&snapshot(4, 3, 0)));
    }

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.name()), Some(s));
        }
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.name()), Some(t));
        }
        assert_eq!(Strategy::parse("fastest"), None);
    }

    fn wait(queued_seq: u64, burst_buffer_fill_permille: u32) -> DrainWait {
        DrainWait { queued_seq, burst_buffer_fill_permille }
    }

    #[test]
    fn drains_never_exceed_the_pfs_limit() {
        let waiting: Vec<DrainWait> = (0..10).map(|i| wait(i, (i as u32 * 97) % 1000)).collect();
        for limit in 0..6 {
            for running in 0..6 {
                for phases in 0..6 {
                    let started = next_drains(&waiting, running, phases, limit);
                    let total = running as usize + phases as usize + started.len();
                    assert!(
                        started.is_empty() || total <= limit.max(1) as usize,
                        "limit {limit} running {running} phases {phases}: started {}",
                        started.len()
                    );
                    let mut unique = started.clone();
                    unique.sort_unstable();
                    unique.dedup();
                    assert_eq!(unique.len(), started.len());
                }
            }
        }
    }

    #[test]
    fn drains_go_urgent_first_then_oldest_and_yield_to_pfs_phases() {
        let waiting = [wait(5, 100), wait(2, 950), wait(1, 0), wait(7, 990)];
        // Idle PFS, 3 slots: urgent by age (2 then 7), then the oldest (1).
        assert_eq!(next_drains(&waiting, 0, 0, 3), vec![1, 3, 2]);
        // A job writes the PFS directly: only urgent drains, within the slots left.
        assert_eq!(next_drains(&waiting, 0, 1, 3), vec![1, 3]);
        assert_eq!(next_drains(&waiting, 1, 1, 3), vec![1]);
        // Full.
        assert!(next_drains(&waiting, 2, 1, 3).is_empty());
    }
}
