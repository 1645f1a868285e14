//! IAS's metadata organizer and data scheduler in the manager (docs/design/ias.md).
//!
//! Clients report their jobs' I/O phases (`POST /v1/tiers/phases`); the manager keeps, per
//! shared tier, the jobs in a phase on it, the bytes they announced and the bandwidth observed
//! over finished phases, and decides each (job, epoch) phase's tier once with
//! [`spillway_policy::choose_tier`], so every process of a job gets the same answer. Drains of
//! every reservation ask it for a PFS slot (`POST /v1/tiers/drains`), which
//! [`spillway_policy::next_drains`] hands out within `manager.pfs_writers_max`, jobs' direct
//! PFS phases counted first; a slot is held under a lease the drainer renews by polling.
//!
//! The board lives in memory: after a manager restart clients report again at their next
//! phase, and drains ask again (their tickets are unknown: the drainer gets 404 and queues
//! anew). Jobs are keyed by (uid, job name): a user can neither end nor see another user's
//! phases, and only the owner of a drain ticket (or an admin) may renew or release it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use spillway_policy::tiering::{DrainWait, PhaseRequest};
use spillway_policy::{choose_tier, next_drains, Strategy, Tier, TierLoad, TierSnapshot};

use crate::service::{api_error, lock, ApiError, Manager};
use crate::Caller;

/// Weight of a new bandwidth sample in a tier's moving average.
const BANDWIDTH_SAMPLE_WEIGHT: f64 = 0.3;

/// Largest bandwidth sample taken, bytes per second (1 TiB/s): clients report their phases'
/// figures, and one absurd report must not own the average.
const BANDWIDTH_SAMPLE_MAX: f64 = (1u64 << 40) as f64;

/// Drains waiting for the PFS, all reservations together; more are refused (busy).
pub const DRAINS_WAITING_MAX: usize = 4096;

/// Phases in progress, all jobs together; more are refused (the job's phase goes to the burst
/// buffer: the client's fallback).
pub const PHASES_MAX: usize = 65_536;

/// Phases in progress and drain tickets one uid may hold: a user flooding the board fills their
/// own share, never everyone's.
pub const PHASES_PER_UID_MAX: usize = 4096;
pub const DRAINS_PER_UID_MAX: usize = 256;

/// A phase report (`POST /v1/tiers/phases`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase", deny_unknown_fields)]
pub enum PhaseReport {
    Begin {
        job: String,
        client: u64,
        processes: u32,
        epoch: u64,
        #[serde(default)]
        strategy: Option<Strategy>,
        #[serde(default)]
        expected_bytes: u64,
        #[serde(default)]
        node_local_free_bytes: u64,
        #[serde(default)]
        node_local_bandwidth_bytes_per_s: u64,
    },
    End {
        job: String,
        client: u64,
        epoch: u64,
        tier: Tier,
        bytes: u64,
        seconds: f64,
    },
    /// The client is gone; the job stops counting as active when its last client left.
    Leave {
        job: String,
        client: u64,
    },
}

/// The answer to a phase report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseDecision {
    /// The phase's tier (for an end: the tier that was reported).
    pub tier: Tier,
    pub strategy: Strategy,
}

/// `GET /v1/tiers`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TiersView {
    pub strategy_default: Strategy,
    pub snapshot: TierSnapshot,
    pub pfs_writers_max: u32,
    pub drains_running: u32,
    pub drains_waiting: u32,
    /// The caller's phases in progress (an admin sees everyone's).
    pub phases: Vec<PhaseView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseView {
    pub uid: u32,
    pub job: String,
    pub epoch: u64,
    pub tier: Tier,
    pub clients: u32,
    pub expected_bytes: u64,
}

/// `POST /v1/tiers/locations`: where one of the caller's epochs now is; `GET
/// /v1/tiers/locations/<epoch>` answers the last one recorded (404 if none).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub job: String,
    pub epoch: u64,
    pub tier: Tier,
    /// The node holding it (node-local) or that wrote it; at most 255 bytes.
    pub host: String,
}

/// Locations one uid may have recorded; the oldest goes first.
pub const LOCATIONS_PER_UID_MAX: usize = 4096;

/// `POST /v1/tiers/drains`: a drain asks for the PFS.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainAsk {
    /// What drains (for `spillway tiers`): a reservation and epoch, or any label.
    pub label: String,
    /// How full the drain's burst buffer is, per mille (0..=1000).
    #[serde(default)]
    pub fill_permille: u32,
}

/// A drain ticket's state.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DrainTicket {
    pub ticket: u64,
    /// `running`: the drain may write the PFS now; `waiting`: ask again later.
    pub state: DrainState,
    /// Drains ahead of this one (0 when running).
    pub ahead: u32,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DrainState {
    Running,
    Waiting,
}

/// `DELETE /v1/tiers/drains/<ticket>`: what the drain moved (for the PFS's bandwidth).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct DrainDone {
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub seconds: f64,
}

/// Why a tiering request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TieringError {
    #[error("invalid tiering request: {reason}")]
    Invalid { reason: String },
    #[error("no drain ticket {ticket} (never issued, released, expired, or the manager restarted: ask again)")]
    NoSuchTicket { ticket: u64 },
    #[error("drain ticket {ticket} belongs to another user")]
    NotYours { ticket: u64 },
    #[error("no location recorded for epoch {epoch} by this user")]
    NoSuchLocation { epoch: u64 },
    #[error("the tiering board is full ({what}); try again later")]
    Busy { what: &'static str },
}
api_error!(TieringError {
    Invalid => (400, "invalid"),
    NoSuchTicket => (404, "no_such_ticket"),
    NotYours => (403, "not_authorized"),
    NoSuchLocation => (404, "not_found"),
    Busy => (503, "busy"),
});

#[derive(Debug)]
struct Phase {
    tier: Tier,
    strategy: Strategy,
    clients: BTreeSet<u64>,
    expected_bytes: u64,
    last_unix_s: u64,
}

#[derive(Debug, Default)]
struct Job {
    clients: BTreeSet<u64>,
    last_unix_s: u64,
}

#[derive(Debug)]
struct Drain {
    owner: u32,
    label: String,
    wait: DrainWait,
    /// Running drains: when the lease ends unless renewed.
    lease_until_unix_s: Option<u64>,
}

/// Everything the scheduler knows.
#[derive(Debug, Default)]
pub struct TierBoard {
    /// (uid, job) → its live clients and last report.
    jobs: BTreeMap<(u32, String), Job>,
    /// (uid, job, epoch) → the phase.
    phases: BTreeMap<(u32, String, u64), Phase>,
    /// Moving averages of observed aggregate bandwidth, bytes per second.
    burst_buffer_bandwidth: f64,
    pfs_bandwidth: f64,
    drains: BTreeMap<u64, Drain>,
    next_ticket: u64,
    /// (uid, epoch) → where it is and when that was recorded (per uid: its own epochs).
    locations: BTreeMap<(u32, u64), (Location, u64)>,
}

impl TierBoard {
    /// Forgets jobs, phases and drain leases that went quiet.
    fn expire(&mut self, now: u64, job_active_s: u64, phase_expire_s: u64) {
        self.jobs.retain(|_, job| {
            !job.clients.is_empty() && now.saturating_sub(job.last_unix_s) <= job_active_s
        });
        self.phases.retain(|_, phase| now.saturating_sub(phase.last_unix_s) <= phase_expire_s);
        self.drains.retain(|_, drain| drain.lease_until_unix_s.is_none_or(|until| now <= until));
    }

    fn seen(&mut self, uid: u32, job: &str, client: u64, now: u64) {
        let entry = self.jobs.entry((uid, job.to_string())).or_default();
        entry.clients.insert(client);
        entry.last_unix_s = now;
    }

    /// A phase begins: the (job, epoch)'s tier, decided by `strategy` at its first report.
    fn begin(
        &mut self,
        uid: u32,
        report: &PhaseReport,
        strategy: Strategy,
        now: u64,
    ) -> Result<PhaseDecision, TieringError> {
        let PhaseReport::Begin {
            job,
            client,
            processes,
            epoch,
            expected_bytes,
            node_local_free_bytes,
            node_local_bandwidth_bytes_per_s,
            ..
        } = report
        else {
            unreachable!("begin is called with a Begin report");
        };
        let key = (uid, job.clone(), *epoch);
        if let Some(phase) = self.phases.get_mut(&key) {
            phase.clients.insert(*client);
            phase.last_unix_s = now;
            return Ok(PhaseDecision { tier: phase.tier, strategy: phase.strategy });
        }
        if self.phases.len() >= PHASES_MAX {
            return Err(TieringError::Busy { what: "phases in progress" });
        }
        if self.phases.keys().filter(|(owner, _, _)| *owner == uid).count() >= PHASES_PER_UID_MAX {
            return Err(TieringError::Busy { what: "this user's phases in progress" });
        }
        let request = PhaseRequest {
            expected_bytes: *expected_bytes,
            node_local_free_bytes: *node_local_free_bytes,
            node_local_bandwidth_bytes_per_s: *node_local_bandwidth_bytes_per_s,
        };
        let tier = choose_tier(strategy, &self.snapshot(), &request).tier();
        let phase = Phase {
            tier,
            strategy,
            clients: BTreeSet::from([*client]),
            // Every process writes its share: the job's phase is about this big.
            expected_bytes: expected_bytes.saturating_mul(u64::from(*processes)),
            last_unix_s: now,
        };
        self.phases.insert(key, phase);
        Ok(PhaseDecision { tier, strategy })
    }

    /// A client's phase ended; the phase is over when all its clients ended it. Its strategy,
    /// if the phase was known.
    fn end(&mut self, uid: u32, job: &str, epoch: u64, client: u64) -> Option<Strategy> {
        let key = (uid, job.to_string(), epoch);
        let phase = self.phases.get_mut(&key)?;
        phase.clients.remove(&client);
        let strategy = phase.strategy;
        if phase.clients.is_empty() {
            self.phases.remove(&key);
        }
        Some(strategy)
    }

    /// A client left: its job stops counting once its last client left, and the phases it was
    /// in end without it.
    fn leave(&mut self, uid: u32, job: &str, client: u64) {
        let key = (uid, job.to_string());
        if let Some(entry) = self.jobs.get_mut(&key) {
            entry.clients.remove(&client);
            if entry.clients.is_empty() {
                self.jobs.remove(&key);
            }
        }
        self.phases.retain(|(phase_uid, name, _), phase| {
            if *phase_uid == uid && name == job {
                phase.clients.remove(&client);
            }
            !phase.clients.is_empty()
        });
    }

    fn jobs_on(&self, tier: Tier) -> u32 {
        let jobs: BTreeSet<(u32, &str)> = self
            .phases
            .iter()
            .filter(|(_, phase)| phase.tier == tier)
            .map(|((uid, job, _), _)| (*uid, job.as_str()))
            .collect();
        jobs.len() as u32
    }

    fn queued_on(&self, tier: Tier) -> u64 {
        self.phases.values().filter(|p| p.tier == tier).map(|p| p.expected_bytes).sum()
    }

    fn drains_running(&self) -> u32 {
        self.drains.values().filter(|d| d.lease_until_unix_s.is_some()).count() as u32
    }

    /// The shared tiers as the policy sees them: jobs' phases (drains wait for them, so they
    /// are not counted as jobs).
    pub fn snapshot(&self) -> TierSnapshot {
        TierSnapshot {
            active_jobs: self.jobs.len() as u32,
            burst_buffer: TierLoad {
                concurrent_jobs: self.jobs_on(Tier::BurstBuffer),
                queued_bytes: self.queued_on(Tier::BurstBuffer),
                bandwidth_bytes_per_s: self.burst_buffer_bandwidth as u64,
            },
            pfs: TierLoad {
                concurrent_jobs: self.jobs_on(Tier::Pfs),
                queued_bytes: self.queued_on(Tier::Pfs),
                bandwidth_bytes_per_s: self.pfs_bandwidth as u64,
            },
        }
    }

    /// Aggregate bandwidth sample: this phase's throughput times the jobs sharing the tier
    /// with it (fair share), folded into the tier's moving average.
    fn observe(&mut self, tier: Tier, bytes: u64, seconds: f64, sharing: u32) {
        if bytes == 0 || seconds <= 0.0 || !seconds.is_finite() {
            return;
        }
        let sample = (bytes as f64 / seconds * f64::from(sharing.max(1))).min(BANDWIDTH_SAMPLE_MAX);
        let average = match tier {
            Tier::BurstBuffer => &mut self.burst_buffer_bandwidth,
            Tier::Pfs => &mut self.pfs_bandwidth,
            Tier::NodeLocal => return,
        };
        *average = if *average == 0.0 {
            sample
        } else {
            *average * (1.0 - BANDWIDTH_SAMPLE_WEIGHT) + sample * BANDWIDTH_SAMPLE_WEIGHT
        };
    }

    /// Starts every waiting drain the policy admits now.
    fn schedule_drains(&mut self, now: u64, pfs_writers_max: u32, lease_s: u64) {
        let waiting: Vec<(u64, DrainWait)> = self
            .drains
            .iter()
            .filter(|(_, d)| d.lease_until_unix_s.is_none())
            .map(|(&ticket, d)| (ticket, d.wait))
            .collect();
        let waits: Vec<DrainWait> = waiting.iter().map(|(_, w)| *w).collect();
        let start =
            next_drains(&waits, self.drains_running(), self.jobs_on(Tier::Pfs), pfs_writers_max);
        for index in start {
            let ticket = waiting[index].0;
            self.drains.get_mut(&ticket).expect("waiting drain").lease_until_unix_s =
                Some(now + lease_s);
        }
        // The invariant the scheduler exists for: never more drains than the PFS takes.
        assert!(
            self.drains_running() <= pfs_writers_max.max(1),
            "{} drains running over the PFS limit of {pfs_writers_max}",
            self.drains_running()
        );
    }

    fn ticket_view(&self, ticket: u64) -> DrainTicket {
        let drain = &self.drains[&ticket];
        match drain.lease_until_unix_s {
            Some(_) => DrainTicket { ticket, state: DrainState::Running, ahead: 0 },
            None => {
                let ahead = self
                    .drains
                    .values()
                    .filter(|d| {
                        d.lease_until_unix_s.is_none() && d.wait.queued_seq < drain.wait.queued_seq
                    })
                    .count() as u32;
                DrainTicket { ticket, state: DrainState::Waiting, ahead }
            }
        }
    }
}

fn check_job(job: &str) -> Result<(), TieringError> {
    spillway_client::tiering::check_job_name(job).map_err(|reason| TieringError::Invalid { reason })
}

impl Manager {
    /// The site's default strategy (`manager.tiering_default`, checked at start).
    pub fn tiering_default(&self) -> Strategy {
        Strategy::parse(&self.knobs().tiering_default).unwrap_or(Strategy::HighPriority)
    }

    fn board(&self) -> std::sync::MutexGuard<'_, TierBoard> {
        let now = self.clock.now_unix_s();
        let mut board = lock(&self.tiers);
        board.expire(now, self.knobs().tiering_job_active_s, self.knobs().tiering_phase_expire_s);
        board.schedule_drains(now, self.knobs().pfs_writers_max, self.knobs().drain_lease_s);
        board
    }

    /// A phase report: a beginning gets the (job, epoch)'s tier, decided at its first report.
    pub fn report_phase(
        &self,
        caller: &Caller,
        report: &PhaseReport,
    ) -> Result<PhaseDecision, TieringError> {
        let now = self.clock.now_unix_s();
        let mut board = self.board();
        let decision = match report {
            PhaseReport::Begin { job, client, processes, strategy, .. } => {
                check_job(job)?;
                if *processes == 0 {
                    return Err(TieringError::Invalid {
                        reason: "processes must be at least 1".into(),
                    });
                }
                let strategy = strategy.unwrap_or_else(|| self.tiering_default());
                board.seen(caller.uid, job, *client, now);
                board.begin(caller.uid, report, strategy, now)?
            }
            PhaseReport::End { job, client, epoch, tier, bytes, seconds } => {
                check_job(job)?;
                board.seen(caller.uid, job, *client, now);
                let sharing = board.jobs_on(*tier).max(1);
                // Only a phase the caller began is a sample: an end report out of nowhere could
                // otherwise steer `measured` for everyone with made-up figures.
                match board.end(caller.uid, job, *epoch, *client) {
                    Some(strategy) => {
                        board.observe(*tier, *bytes, *seconds, sharing);
                        PhaseDecision { tier: *tier, strategy }
                    }
                    None => PhaseDecision { tier: *tier, strategy: self.tiering_default() },
                }
            }
            PhaseReport::Leave { job, client } => {
                check_job(job)?;
                board.leave(caller.uid, job, *client);
                PhaseDecision { tier: Tier::BurstBuffer, strategy: self.tiering_default() }
            }
        };
        board.schedule_drains(now, self.knobs().pfs_writers_max, self.knobs().drain_lease_s);
        Ok(decision)
    }

    /// The tiers now, and the caller's phases (an admin's: everyone's).
    pub fn tiers(&self, caller: &Caller) -> TiersView {
        let board = self.board();
        let phases = board
            .phases
            .iter()
            .filter(|((uid, _, _), _)| caller.admin || *uid == caller.uid)
            .map(|((uid, job, epoch), phase)| PhaseView {
                uid: *uid,
                job: job.clone(),
                epoch: *epoch,
                tier: phase.tier,
                clients: phase.clients.len() as u32,
                expected_bytes: phase.expected_bytes,
            })
            .collect();
        TiersView {
            strategy_default: self.tiering_default(),
            snapshot: board.snapshot(),
            pfs_writers_max: self.knobs().pfs_writers_max,
            drains_running: board.drains_running(),
            drains_waiting: board.drains.len() as u32 - board.drains_running(),
            phases,
        }
    }

    /// A drain asks for the PFS: running at once if the scheduler admits it, else waiting.
    pub fn ask_drain(&self, caller: &Caller, ask: &DrainAsk) -> Result<DrainTicket, TieringError> {
        if ask.fill_permille > 1000 || ask.label.len() > 256 {
            return Err(TieringError::Invalid {
                reason: "fill_permille is 0..=1000 and label at most 256 bytes".into(),
            });
        }
        let now = self.clock.now_unix_s();
        let mut board = self.board();
        if board.drains.len() >= DRAINS_WAITING_MAX {
            return Err(TieringError::Busy { what: "drains waiting" });
        }
        if board.drains.values().filter(|d| d.owner == caller.uid).count() >= DRAINS_PER_UID_MAX {
            return Err(TieringError::Busy { what: "this user's drains" });
        }
        board.next_ticket += 1;
        let ticket = board.next_ticket;
        board.drains.insert(
            ticket,
            Drain {
                owner: caller.uid,
                label: ask.label.clone(),
                wait: DrainWait {
                    queued_seq: ticket,
                    burst_buffer_fill_permille: ask.fill_permille,
                },
                lease_until_unix_s: None,
            },
        );
        board.schedule_drains(now, self.knobs().pfs_writers_max, self.knobs().drain_lease_s);
        Ok(board.ticket_view(ticket))
    }

    fn owned_ticket(board: &TierBoard, caller: &Caller, ticket: u64) -> Result<(), TieringError> {
        match board.drains.get(&ticket) {
            None => Err(TieringError::NoSuchTicket { ticket }),
            Some(drain) if drain.owner != caller.uid && !caller.admin => {
                Err(TieringError::NotYours { ticket })
            }
            Some(_) => Ok(()),
        }
    }

    /// A drain polls its ticket: a running drain's lease is renewed.
    pub fn poll_drain(&self, caller: &Caller, ticket: u64) -> Result<DrainTicket, TieringError> {
        let now = self.clock.now_unix_s();
        let lease_s = self.knobs().drain_lease_s;
        let mut board = self.board();
        Self::owned_ticket(&board, caller, ticket)?;
        let drain = board.drains.get_mut(&ticket).expect("checked above");
        if drain.lease_until_unix_s.is_some() {
            drain.lease_until_unix_s = Some(now + lease_s);
        }
        Ok(board.ticket_view(ticket))
    }

    /// A drain is done (or gave up): its slot goes to the next one.
    pub fn release_drain(
        &self,
        caller: &Caller,
        ticket: u64,
        done: &DrainDone,
    ) -> Result<DrainTicket, TieringError> {
        let now = self.clock.now_unix_s();
        let mut board = self.board();
        Self::owned_ticket(&board, caller, ticket)?;
        let view = board.ticket_view(ticket);
        let drain = board.drains.remove(&ticket).expect("checked above");
        if drain.lease_until_unix_s.is_some() {
            let sharing = board.jobs_on(Tier::Pfs) + board.drains_running() + 1;
            board.observe(Tier::Pfs, done.bytes, done.seconds, sharing);
        }
        let _ = drain.label;
        board.schedule_drains(now, self.knobs().pfs_writers_max, self.knobs().drain_lease_s);
        Ok(view)
    }
}

/// Turns tiering on for a job's processes: a strategy name, `site` (the manager's default), or
/// unset, empty or `off` (no tiering). Set by `slurm_bb_paths` from `tiering=`.
pub const TIERING_ENV: &str = "SPILLWAY_TIERING";
/// The job the phases belong to (default: `SLURM_JOB_ID`).
pub const TIERING_JOB_ENV: &str = "SPILLWAY_TIERING_JOB";
/// The PFS directory direct PFS phases write (the reservation's drain directory); without it no
/// phase goes to the PFS.
pub const TIERING_PFS_ENV: &str = "SPILLWAY_TIERING_PFS";
/// The node-local tier's directory on this node; without it no phase goes node-local.
pub const NODE_LOCAL_DIR_ENV: &str = "SPILLWAY_NODE_LOCAL_DIR";
/// The node-local tier's capacity per process (a size; default [`NODE_LOCAL_BYTES_DEFAULT`]).
pub const NODE_LOCAL_BYTES_ENV: &str = "SPILLWAY_NODE_LOCAL_BYTES";
/// Node-local capacity per process when [`NODE_LOCAL_BYTES_ENV`] is unset.
pub const NODE_LOCAL_BYTES_DEFAULT: u64 = 1 << 30;

/// The tiering settings of a job's process from its environment (the variables above, the
/// manager from `SPILLWAY_MANAGER`, the process count from `SLURM_NTASKS`): what the C ABI
/// and any client built without explicit settings use. `Ok(None)`: tiering is off.
pub fn tiering_from_env() -> Result<Option<spillway_client::TieringOptions>, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let strategy = match var(TIERING_ENV).as_deref() {
        None | Some("off") => return Ok(None),
        Some("site") => None,
        Some(name) => Some(Strategy::parse(name).ok_or_else(|| {
            format!("{TIERING_ENV}={name}: expected baseline, high-priority, interference-aware, measured, site or off")
        })?),
    };
    let job = var(TIERING_JOB_ENV).or_else(|| var("SLURM_JOB_ID")).ok_or_else(|| {
        format!("{TIERING_ENV} is set but neither {TIERING_JOB_ENV} nor SLURM_JOB_ID names the job")
    })?;
    let processes = var("SLURM_NTASKS").and_then(|n| n.parse::<u32>().ok()).unwrap_or(1).max(1);
    let capacity_bytes = match var(NODE_LOCAL_BYTES_ENV) {
        None => NODE_LOCAL_BYTES_DEFAULT,
        Some(text) => spillway_types::parse_size(&text)
            .map_err(|e| format!("{NODE_LOCAL_BYTES_ENV}={text}: {e}"))?,
    };
    let node_local = var(NODE_LOCAL_DIR_ENV).map(|directory| spillway_client::NodeLocalOptions {
        directory: directory.into(),
        capacity_bytes,
        bandwidth_bytes_per_s: 0,
    });
    let api = crate::ApiClient::from_flag(None).map_err(|e| e.to_string())?;
    Ok(Some(spillway_client::TieringOptions {
        processes,
        strategy,
        pfs_directory: var(TIERING_PFS_ENV).map(Into::into),
        node_local,
        service: Some(std::sync::Arc::new(ManagerTiers::new(api))),
        ..spillway_client::TieringOptions::new(job)
    }))
}

impl Manager {
    /// Records where one of the caller's epochs is.
    pub fn record_location(
        &self,
        caller: &Caller,
        location: &Location,
    ) -> Result<Location, TieringError> {
        check_job(&location.job)?;
        if location.host.len() > 255 || location.host.chars().any(char::is_control) {
            return Err(TieringError::Invalid {
                reason: "host: at most 255 bytes, no control characters".into(),
            });
        }
        let now = self.clock.now_unix_s();
        let mut board = lock(&self.tiers);
        let mine: Vec<(u64, u64)> = board
            .locations
            .iter()
            .filter(|((uid, _), _)| *uid == caller.uid)
            .map(|((_, epoch), (_, at))| (*at, *epoch))
            .collect();
        if mine.len() >= LOCATIONS_PER_UID_MAX
            && !board.locations.contains_key(&(caller.uid, location.epoch))
        {
            let oldest = mine.iter().min().expect("at the bound, so not empty").1;
            board.locations.remove(&(caller.uid, oldest));
        }
        board.locations.insert((caller.uid, location.epoch), (location.clone(), now));
        Ok(location.clone())
    }

    /// Where the caller's epoch is, as last recorded by the caller.
    pub fn locate(&self, caller: &Caller, epoch: u64) -> Result<Location, TieringError> {
        let board = lock(&self.tiers);
        board
            .locations
            .get(&(caller.uid, epoch))
            .map(|(location, _)| location.clone())
            .ok_or(TieringError::NoSuchLocation { epoch })
    }

    /// Every location the caller recorded, in epoch order (at most `LOCATIONS_PER_UID_MAX`).
    pub fn locations(&self, caller: &Caller) -> Vec<Location> {
        let board = lock(&self.tiers);
        board
            .locations
            .range((caller.uid, 0)..=(caller.uid, u64::MAX))
            .map(|(_, (location, _))| location.clone())
            .collect()
    }
}

/// The manager as a client's [`spillway_client::TierService`], over its API.
pub struct ManagerTiers {
    api: crate::ApiClient,
}

impl ManagerTiers {
    pub fn new(api: crate::ApiClient) -> ManagerTiers {
        ManagerTiers { api }
    }
}

impl spillway_client::TierService for ManagerTiers {
    fn begin_phase(&self, begin: &spillway_client::PhaseBegin) -> Result<Tier, String> {
        let report = PhaseReport::Begin {
            job: begin.job.clone(),
            client: begin.client,
            processes: begin.processes,
            epoch: begin.epoch.0,
            strategy: begin.strategy,
            expected_bytes: begin.expected_bytes,
            node_local_free_bytes: begin.node_local_free_bytes,
            node_local_bandwidth_bytes_per_s: begin.node_local_bandwidth_bytes_per_s,
        };
        let decision: PhaseDecision =
            self.api.post("/v1/tiers/phases", &report).map_err(|e| e.to_string())?;
        Ok(decision.tier)
    }

    fn end_phase(&self, end: &spillway_client::PhaseEnd) -> Result<(), String> {
        let report = PhaseReport::End {
            job: end.job.clone(),
            client: end.client,
            epoch: end.epoch.0,
            tier: end.tier,
            bytes: end.bytes,
            seconds: end.seconds,
        };
        let _: PhaseDecision =
            self.api.post("/v1/tiers/phases", &report).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn snapshot(&self) -> Result<TierSnapshot, String> {
        let view: TiersView = self.api.get("/v1/tiers").map_err(|e| e.to_string())?;
        Ok(view.snapshot)
    }

    fn record_location(&self, location: &spillway_client::EpochLocation) -> Result<(), String> {
        let body = Location {
            job: location.job.clone(),
            epoch: location.epoch.0,
            tier: location.tier,
            host: location.host.clone(),
        };
        let _: Location = self.api.post("/v1/tiers/locations", &body).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn locate(
        &self,
        epoch: spillway_types::EpochId,
    ) -> Result<Option<spillway_client::EpochLocation>, String> {
        match self.api.get::<Location>(&format!("/v1/tiers/locations/{}", epoch.0)) {
            Ok(found) => Ok(Some(spillway_client::EpochLocation {
                job: found.job,
                epoch,
                tier: found.tier,
                host: found.host,
            })),
            Err(e) if e.kind() == Some("not_found") => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn locations(&self) -> Result<Vec<spillway_client::EpochLocation>, String> {
        let found: Vec<Location> =
            self.api.get("/v1/tiers/locations").map_err(|e| e.to_string())?;
        Ok(found
            .into_iter()
            .map(|l| spillway_client::EpochLocation {
                job: l.job,
                epoch: spillway_types::EpochId(l.epoch),
                tier: l.tier,
                host: l.host,
            })
            .collect())
    }

    fn leave(&self, job: &str, client: u64) -> Result<(), String> {
        let report = PhaseReport::Leave { job: job.to_string(), client };
        let _: PhaseDecision =
            self.api.post("/v1/tiers/phases", &report).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// A PFS slot held by a drain (`POST /v1/tiers/drains`), released on drop with what the drain
/// moved. [`DrainSlot::acquire`] waits, polling (which renews the lease), until the scheduler
/// lets the drain run.
pub struct DrainSlot<'a> {
    api: &'a crate::ApiClient,
    ticket: u64,
    started: std::time::Instant,
    /// Bytes the drain moved (for the PFS bandwidth the scheduler measures).
    pub bytes: u64,
}

/// How often a waiting drain asks again.
const DRAIN_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl<'a> DrainSlot<'a> {
    /// Waits for a PFS slot, at most `wait_max`.
    pub fn acquire(
        api: &'a crate::ApiClient,
        label: &str,
        fill_permille: u32,
        wait_max: std::time::Duration,
    ) -> Result<DrainSlot<'a>, crate::ApiClientError> {
        let ask = DrainAsk { label: label.to_string(), fill_permille: fill_permille.min(1000) };
        let mut ticket: DrainTicket = api.post("/v1/tiers/drains", &ask)?;
        let deadline = std::time::Instant::now() + wait_max;
        while ticket.state == DrainState::Waiting {
            if std::time::Instant::now() > deadline {
                let _: Result<DrainTicket, _> = api.post(
                    &format!("/v1/tiers/drains/{}/done", ticket.ticket),
                    &DrainDone::default(),
                );
                return Err(crate::ApiClientError::Api {
                    status: 503,
                    kind: "busy".into(),
                    message: format!(
                        "drain {label:?} waited {} s for a PFS slot ({} drains ahead); try again later",
                        wait_max.as_secs(),
                        ticket.ahead
                    ),
                });
            }
            std::thread::sleep(DRAIN_POLL_INTERVAL);
            ticket = api.get(&format!("/v1/tiers/drains/{}", ticket.ticket))?;
        }
        Ok(DrainSlot { api, ticket: ticket.ticket, started: std::time::Instant::now(), bytes: 0 })
    }

    /// Renews the lease (a drain longer than `manager.drain_lease_s` calls it now and then).
    pub fn renew(&self) -> Result<(), crate::ApiClientError> {
        let _: DrainTicket = self.api.get(&format!("/v1/tiers/drains/{}", self.ticket))?;
        Ok(())
    }
}

impl Drop for DrainSlot<'_> {
    fn drop(&mut self) {
        let done = DrainDone { bytes: self.bytes, seconds: self.started.elapsed().as_secs_f64() };
        // Best effort: an unreleased slot expires with its lease.
        let _: Result<DrainTicket, _> =
            self.api.post(&format!("/v1/tiers/drains/{}/done", self.ticket), &done);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::service::Clock;

    struct TestClock(AtomicU64);

    impl Clock for TestClock {
        fn now_unix_s(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn manager(
        strategy: &str,
        pfs_writers_max: u32,
    ) -> (Manager, Arc<TestClock>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(&dir.path().join("manager.db")).unwrap();
        let knobs = spillway_config::ManagerKnobs {
            tiering_default: strategy.to_string(),
            pfs_writers_max,
            ..spillway_config::ManagerKnobs::default()
        };
        knobs.validate().unwrap();
        let clock = Arc::new(TestClock(AtomicU64::new(1_000_000)));
        let manager = Manager::new(db, knobs, None, clock.clone()).unwrap();
        (manager, clock, dir)
    }

    fn user(uid: u32) -> Caller {
        Caller { uid, gid: uid, groups: vec![uid], admin: false }
    }

    fn begin(job: &str, client: u64, epoch: u64) -> PhaseReport {
        PhaseReport::Begin {
            job: job.into(),
            client,
            processes: 2,
            epoch,
            strategy: None,
            expected_bytes: 1 << 20,
            node_local_free_bytes: 1 << 30,
            node_local_bandwidth_bytes_per_s: 0,
        }
    }

    fn end(job: &str, client: u64, epoch: u64, tier: Tier) -> PhaseReport {
        PhaseReport::End { job: job.into(), client, epoch, tier, bytes: 1 << 20, seconds: 0.5 }
    }

    #[test]
    fn config_accepts_exactly_the_policy_strategies() {
        for strategy in Strategy::ALL {
            let knobs = spillway_config::ManagerKnobs {
                tiering_default: strategy.name().into(),
                ..spillway_config::ManagerKnobs::default()
            };
            knobs.validate().unwrap();
        }
        let knobs = spillway_config::ManagerKnobs {
            tiering_default: "fastest".into(),
            ..spillway_config::ManagerKnobs::default()
        };
        assert!(knobs.validate().unwrap_err().to_string().contains("tiering_default"));
    }

    #[test]
    fn every_process_of_a_job_gets_the_phase_decided_first_and_the_decision_is_the_policys() {
        let (manager, _, _dir) = manager("interference-aware", 4);
        let alice = user(1000);
        let bob = user(1001);
        // Job a, process 1: N = 1, nobody on the BB.
        let first = manager.report_phase(&alice, &begin("a", 1, 7)).unwrap();
        assert_eq!(first.tier, Tier::BurstBuffer);
        // Job b: N = 2, a is on the BB; the same call the simulator makes says PFS.
        let before = manager.tiers(&bob).snapshot;
        let expected = choose_tier(
            Strategy::InterferenceAware,
            &before,
            &PhaseRequest {
                expected_bytes: 1 << 20,
                node_local_free_bytes: 1 << 30,
                node_local_bandwidth_bytes_per_s: 0,
            },
        );
        let second = manager.report_phase(&bob, &begin("b", 9, 7)).unwrap();
        assert_eq!(second.tier, Tier::Pfs);
        assert_eq!(second.tier, expected.tier());
        // Job a, process 2, same epoch: the answer its first process got, whatever the load.
        assert_eq!(
            manager.report_phase(&alice, &begin("a", 2, 7)).unwrap().tier,
            Tier::BurstBuffer
        );
        // Job a, another epoch: both shared tiers at N/2 → node-local.
        assert_eq!(manager.report_phase(&alice, &begin("a", 1, 8)).unwrap().tier, Tier::NodeLocal);
        let view = manager.tiers(&alice);
        assert_eq!(view.snapshot.active_jobs, 2);
        assert_eq!(view.snapshot.burst_buffer.concurrent_jobs, 1);
        assert_eq!(view.snapshot.pfs.concurrent_jobs, 1);
        // Alice sees her phases only.
        assert!(view.phases.iter().all(|p| p.uid == 1000));
        assert_eq!(view.phases.len(), 2);
        // Bob's report of job "a" is a job of his own: Alice's phase stays.
        manager.report_phase(&bob, &end("a", 1, 7, Tier::BurstBuffer)).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.burst_buffer.concurrent_jobs, 1);
        // The phase ends when both of its processes ended; the bandwidth is measured then.
        manager.report_phase(&alice, &end("a", 1, 7, Tier::BurstBuffer)).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.burst_buffer.concurrent_jobs, 1);
        manager.report_phase(&alice, &end("a", 2, 7, Tier::BurstBuffer)).unwrap();
        let after = manager.tiers(&alice).snapshot;
        assert_eq!(after.burst_buffer.concurrent_jobs, 0);
        assert!(after.burst_buffer.bandwidth_bytes_per_s > 0);
    }

    #[test]
    fn a_job_stops_counting_when_its_last_client_leaves() {
        let (manager, _, _dir) = manager("interference-aware", 4);
        let alice = user(1000);
        manager.report_phase(&alice, &begin("a", 1, 1)).unwrap();
        manager.report_phase(&alice, &begin("a", 2, 1)).unwrap();
        manager.report_phase(&alice, &begin("b", 3, 1)).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.active_jobs, 2);
        let leave = |client| PhaseReport::Leave { job: "a".into(), client };
        manager.report_phase(&alice, &leave(1)).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.active_jobs, 2);
        manager.report_phase(&alice, &leave(2)).unwrap();
        let snapshot = manager.tiers(&alice).snapshot;
        assert_eq!(snapshot.active_jobs, 1);
        assert_eq!(manager.tiers(&alice).phases.len(), 1, "job a's phase left with its clients");
    }

    #[test]
    fn quiet_jobs_and_abandoned_phases_expire() {
        let (manager, clock, _dir) = manager("interference-aware", 4);
        let alice = user(1000);
        manager.report_phase(&alice, &begin("a", 1, 1)).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.active_jobs, 1);
        clock.0.fetch_add(manager.knobs().tiering_phase_expire_s + 1, Ordering::SeqCst);
        let snapshot = manager.tiers(&alice).snapshot;
        assert_eq!(snapshot.active_jobs, 0);
        assert_eq!(snapshot.burst_buffer.concurrent_jobs, 0);
    }

    #[test]
    fn only_begun_phases_feed_the_bandwidth_and_samples_are_capped() {
        let (manager, _, _dir) = manager("measured", 4);
        let alice = user(1000);
        let absurd = PhaseReport::End {
            job: "a".into(),
            client: 1,
            epoch: 9,
            tier: Tier::Pfs,
            bytes: u64::MAX,
            seconds: 1e-9,
        };
        manager.report_phase(&alice, &absurd).unwrap();
        assert_eq!(manager.tiers(&alice).snapshot.pfs.bandwidth_bytes_per_s, 0, "no phase 9 began");
        manager.report_phase(&alice, &begin("a", 1, 9)).unwrap();
        manager.report_phase(&alice, &absurd).unwrap();
        let observed = manager.tiers(&alice).snapshot.pfs.bandwidth_bytes_per_s;
        assert_eq!(observed, BANDWIDTH_SAMPLE_MAX as u64);
    }

    #[test]
    fn bad_reports_are_named() {
        let (manager, _, _dir) = manager("high-priority", 4);
        let alice = user(1000);
        let error = manager.report_phase(&alice, &begin("../etc", 1, 1)).unwrap_err();
        assert!(error.to_string().contains("job name"), "{error}");
        let zero = PhaseReport::Begin {
            job: "a".into(),
            client: 1,
            processes: 0,
            epoch: 1,
            strategy: None,
            expected_bytes: 0,
            node_local_free_bytes: 0,
            node_local_bandwidth_bytes_per_s: 0,
        };
        assert!(manager.report_phase(&alice, &zero).unwrap_err().to_string().contains("processes"));
        let ask = DrainAsk { label: "x".into(), fill_permille: 1001 };
        assert!(manager.ask_drain(&alice, &ask).is_err());
    }

    #[test]
    fn drain_slots_stay_within_the_pfs_limit_and_belong_to_their_owner() {
        let (manager, clock, _dir) = manager("interference-aware", 2);
        let alice = user(1000);
        let bob = user(1001);
        let ask = |fill| DrainAsk { label: "res epoch".into(), fill_permille: fill };
        let t1 = manager.ask_drain(&alice, &ask(0)).unwrap();
        let t2 = manager.ask_drain(&bob, &ask(0)).unwrap();
        let t3 = manager.ask_drain(&alice, &ask(0)).unwrap();
        assert_eq!(
            (t1.state, t2.state, t3.state),
            (DrainState::Running, DrainState::Running, DrainState::Waiting)
        );
        assert_eq!(t3.ahead, 0);
        assert!(matches!(manager.poll_drain(&bob, t1.ticket), Err(TieringError::NotYours { .. })));
        assert!(matches!(
            manager.release_drain(&bob, t1.ticket, &DrainDone::default()),
            Err(TieringError::NotYours { .. })
        ));
        // A drain ends: the next one runs.
        manager
            .release_drain(&alice, t1.ticket, &DrainDone { bytes: 8 << 20, seconds: 1.0 })
            .unwrap();
        assert_eq!(manager.poll_drain(&alice, t3.ticket).unwrap().state, DrainState::Running);
        assert!(manager.tiers(&alice).snapshot.pfs.bandwidth_bytes_per_s > 0);
        manager.release_drain(&alice, t3.ticket, &DrainDone::default()).unwrap();
        manager.release_drain(&bob, t2.ticket, &DrainDone::default()).unwrap();
        // A job writes the PFS directly: only an urgent drain (a filling buffer) may join it.
        manager.report_phase(&bob, &begin("b", 1, 1)).unwrap(); // BB
        let phase = manager.report_phase(&alice, &begin("a", 1, 1)).unwrap();
        assert_eq!(phase.tier, Tier::Pfs);
        let calm = manager.ask_drain(&alice, &ask(100)).unwrap();
        assert_eq!(calm.state, DrainState::Waiting);
        let urgent = manager.ask_drain(&bob, &ask(950)).unwrap();
        assert_eq!(urgent.state, DrainState::Running);
        // The job's PFS phase ends: the calm drain runs beside the urgent one (limit 2).
        manager.report_phase(&alice, &end("a", 1, 1, Tier::Pfs)).unwrap();
        assert_eq!(manager.poll_drain(&alice, calm.ticket).unwrap().state, DrainState::Running);
        // A holder that stops renewing loses its slot.
        clock.0.fetch_add(manager.knobs().drain_lease_s + 1, Ordering::SeqCst);
        assert!(matches!(
            manager.poll_drain(&bob, urgent.ticket),
            Err(TieringError::NoSuchTicket { .. })
        ));
    }

    #[test]
    fn locations_are_each_users_own_and_bounded() {
        let (manager, _, _dir) = manager("interference-aware", 2);
        let (alice, bob) = (user(1000), user(1001));
        let here = |epoch, tier| Location { job: "a".into(), epoch, tier, host: "host3".into() };
        manager.record_location(&alice, &here(7, Tier::NodeLocal)).unwrap();
        assert_eq!(manager.locate(&alice, 7).unwrap(), here(7, Tier::NodeLocal));
        assert!(matches!(manager.locate(&bob, 7), Err(TieringError::NoSuchLocation { epoch: 7 })));
        // Moved: the newer record wins.
        manager.record_location(&alice, &here(7, Tier::BurstBuffer)).unwrap();
        assert_eq!(manager.locate(&alice, 7).unwrap().tier, Tier::BurstBuffer);
        let bad = Location { host: "x\ny".into(), ..here(8, Tier::Pfs) };
        assert!(manager.record_location(&alice, &bad).unwrap_err().to_string().contains("host"));
        // A user's records are bounded: the oldest goes.
        for epoch in 100..100 + LOCATIONS_PER_UID_MAX as u64 {
            manager.record_location(&bob, &here(epoch, Tier::Pfs)).unwrap();
        }
        manager.record_location(&bob, &here(1, Tier::Pfs)).unwrap();
        let bobs = lock(&manager.tiers).locations.keys().filter(|(uid, _)| *uid == 1001).count();
        assert_eq!(bobs, LOCATIONS_PER_UID_MAX);
        assert_eq!(manager.locate(&alice, 7).unwrap().tier, Tier::BurstBuffer, "alice untouched");
    }

    #[test]
    fn random_drain_traffic_never_runs_over_the_limit() {
        let (manager, _, _dir) = manager("interference-aware", 3);
        let alice = user(1000);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut tickets = Vec::new();
        let mut refused = 0;
        for _ in 0..2000 {
            match next() % 5 {
                0 | 1 => {
                    let ask = DrainAsk { label: "r".into(), fill_permille: (next() % 1001) as u32 };
                    match manager.ask_drain(&alice, &ask) {
                        Ok(ticket) => tickets.push(ticket.ticket),
                        // A user's share of the board is bounded: more are refused, not queued.
                        Err(TieringError::Busy { .. }) => refused += 1,
                        Err(other) => panic!("{other}"),
                    }
                }
                2 if !tickets.is_empty() => {
                    let ticket = tickets.swap_remove((next() as usize) % tickets.len());
                    manager.release_drain(&alice, ticket, &DrainDone::default()).unwrap();
                }
                3 => {
                    let epoch = next() % 4;
                    let _ =
                        manager.report_phase(&alice, &begin(&format!("j{}", next() % 3), 1, epoch));
                }
                _ => {
                    let epoch = next() % 4;
                    let _ = manager.report_phase(
                        &alice,
                        &end(&format!("j{}", next() % 3), 1, epoch, Tier::Pfs),
                    );
                }
            }
            assert!(tickets.len() <= DRAINS_PER_UID_MAX);
            let view = manager.tiers(&alice);
            assert!(view.drains_running <= 3, "{} drains running", view.drains_running);
        }
        assert!(refused > 0, "the run reached the per-user bound ({DRAINS_PER_UID_MAX})");
    }
}
