//! The BIOS synthetic burst buffer workload (Koo et al., 5.2) with a closed-loop time model.
//!
//! K nodes with one SSD each; U users per node, T threads per user; every thread writes
//! fixed-size files (64 MiB) back to back. Files are striped in stripe units over the SSDs of the
//! user's pool (`stripe_count` SSDs; pools are disjoint, user `u` is in pool `u mod pools`).
//! Each user has a quota; when a finished file takes the user over it, the oldest 15 % of the
//! user's files (at least one) are deleted and TRIMmed. Quotas differ by lifetime class
//! (multipliers `quota_classes`), so users' data live for different times.
//!
//! Grouping configurations (which users share a stream under user-ID mapping). Algorithm 1
//! registers users in order and hands out idle streams first, then the least used, so with 32
//! users and 8 streams user `u` lands on stream `u mod 8` together with `u±8, u±16, u±24`. With
//! `s = u mod 8` and `r = u div 8`:
//! - configuration 1: class = `s mod 4` — all users of a stream have the same lifetime;
//! - configuration 2: class = `2·(s mod 2) + r div 2` — half of a stream's users share one;
//! - configuration 3: class = `r` — all users of a stream have different lifetimes.
//!
//! - configuration 4 (ours, not in BIOS): class = `u mod classes`; with as many classes as
//!   users, every user has its own lifetime, so no grouping can be perfect.
//!
//! Configurations 1–3 have the same number of users per class, so the same total quota.
//!
//! Time model: threads are closed-loop. A thread issues one stripe row at a time — the next
//! stripe unit on each SSD of its pool, in parallel — and issues the next row when the slowest
//! of them is done. Each SSD serves stripe units in issue order; a unit's service time is the
//! device time it consumed: its page programs plus any foreground GC (copies + erases) it had
//! to wait for. The next row comes from the thread that is ready first, so writes of all
//! threads interleave at stripe-unit granularity, which is what mixes users inside blocks.
//! Within one round (every thread of the pool served once) the order of threads is random.
//! A file's write latency is the sum of its rows' waits (issue → slowest unit done).

use crate::device::{DeviceModel, QueuedDevice};
use crate::mapping::{Mapping, StreamMapper};
use crate::report::{LatencyPercentiles, RunReport, Sampler, SsdSummary, UserSummary};
use crate::ssd::{NandOp, SsdConfig};
use crate::volume::{FileSystemModel, StripedFile, Volume, VolumeError};
use rand::{Rng, SeedableRng};
use spillway_types::StreamKey;
use std::collections::VecDeque;

/// Parameters of one BIOS synthetic run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BiosParams {
    pub ssd: SsdConfig,
    pub nodes: u16,
    pub users_per_node: u16,
    pub threads_per_user: u16,
    pub file_bytes: u64,
    pub stripe_unit_bytes: u64,
    /// SSDs per pool (a file is striped over its pool).
    pub stripe_count: u16,
    /// Relative write rate per user (weights), cycled over users: user `u` has
    /// `write_shares[u mod len]`. A user with share 2 keeps twice the requests in flight of one
    /// with share 1, so it writes about twice the pages. All equal (the BIOS setup) = `[1.0]`.
    pub write_shares: Vec<f64>,
    /// Quota weight per user, cycled like `write_shares`; empty = the lifetime-class multiplier
    /// `quota_classes[class_of(u)]` of the grouping configuration.
    pub capacity_shares: Vec<f64>,
    /// Quota multiplier per lifetime class.
    pub quota_classes: Vec<f64>,
    /// Grouping configuration 1, 2, 3 (BIOS) or 4 (every user its own class).
    pub configuration: u8,
    /// Interleave: stripe rows a thread issues per turn before the next thread is served, so
    /// users' writes interleave on a device in runs of `rows_per_turn × stripe_unit_bytes`.
    pub rows_per_turn: u32,
    /// What a user deletes when a finished file takes it over quota.
    pub delete_rule: DeleteRule,
    /// Device utilisation: quotas plus the data in flight fill this fraction of each pool's
    /// logical capacity (1 = a fully subscribed burst buffer).
    pub device_utilisation: f64,
    /// Host bytes written ÷ logical capacity over the whole run (the steady-state window is its
    /// second half, [`crate::report::SteadyWindow`]).
    pub device_writes: f64,
    pub samples: u32,
    pub seed: u64,
    /// σ of the log-normal error on lifetime estimates (lifetime-aware mapping; 0 = exact).
    pub lifetime_estimate_noise: f64,
    /// The file system's allocator and whether deletes TRIM (see [`crate::volume`]).
    pub fs: FileSystemModel,
}

/// Fraction of a user's files BIOS deletes when over quota (5.2).
pub const BIOS_DELETE_FRACTION: f64 = 0.15;

/// What a user deletes, oldest first, when a finished file takes it over quota.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
pub enum DeleteRule {
    /// BIOS 5.2: the oldest `fraction` of the user's files (rounded up), at least one.
    OldestFraction { fraction: f64 },
    /// The oldest files, one at a time, until the user is within quota again (a purge that
    /// frees only what it must).
    OldestUntilWithinQuota,
}

impl DeleteRule {
    /// The BIOS rule: the oldest 15 % of the user's files, at least one.
    pub const BIOS: DeleteRule = DeleteRule::OldestFraction { fraction: BIOS_DELETE_FRACTION };

    pub fn name(self) -> &'static str {
        match self {
            DeleteRule::OldestFraction { .. } => "oldest_fraction",
            DeleteRule::OldestUntilWithinQuota => "oldest_until_within_quota",
        }
    }
}

/// Quota multipliers for configuration 4: one class per user, spaced geometrically over the
/// same 1–8 range as the four BIOS classes (8^(u/(users−1))).
pub fn distinct_quota_classes(users: u32) -> Vec<f64> {
    (0..users).map(|u| 8f64.powf(u as f64 / (users.max(2) - 1) as f64)).collect()
}

/// Why a BIOS run cannot proceed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BiosError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("bios parameter {name} = {value}: {reason}")]
    Parameter { name: &'static str, value: String, reason: String },
    #[error("ssd {ssd} ran out of logical space while user {user} wrote file {file}: quotas exceed the pool capacity")]
    OutOfSpace { ssd: usize, user: u32, file: u64 },
}

impl BiosParams {
    pub fn users(&self) -> u32 {
        self.nodes as u32 * self.users_per_node as u32
    }

    pub fn pools(&self) -> u16 {
        self.nodes / self.stripe_count
    }

    /// Lifetime class of user `u` under the configuration (see the module doc).
    pub fn class_of(&self, user: u32) -> usize {
        let streams = self.ssd.streams as u32;
        let classes = self.quota_classes.len() as u32;
        let s = user % streams;
        let r = user / streams;
        let class = match self.configuration {
            1 => s % classes,
            2 => (2 * (s % 2) + r / 2) % classes,
            3 => r % classes,
            _ => user % classes,
        };
        class as usize
    }

    /// The BIOS 5.2 setup on `ssd`: 4 nodes × 8 users × 2 threads, 64 MiB files striped over
    /// all 4 SSDs, quota classes 1:2:4:8 (configuration 3), equal write shares, one stripe row
    /// per turn, the oldest 15 % deleted when over quota, a fully subscribed burst buffer.
    pub fn bios_setup(
        ssd: SsdConfig,
        stripe_unit_bytes: u64,
        device_writes: f64,
        seed: u64,
    ) -> BiosParams {
        BiosParams {
            ssd,
            nodes: 4,
            users_per_node: 8,
            threads_per_user: 2,
            file_bytes: 64 * spillway_types::MIB,
            stripe_unit_bytes,
            stripe_count: 4,
            write_shares: vec![1.0],
            capacity_shares: Vec::new(),
            quota_classes: vec![1.0, 2.0, 4.0, 8.0],
            configuration: 3,
            rows_per_turn: 1,
            delete_rule: DeleteRule::BIOS,
            device_utilisation: 1.0,
            device_writes,
            samples: 60,
            seed,
            lifetime_estimate_noise: 0.0,
            fs: FileSystemModel::default(),
        }
    }

    /// Write share of user `u` (weights cycled over users).
    pub fn write_share(&self, user: u32) -> f64 {
        self.write_shares[user as usize % self.write_shares.len()]
    }

    /// Quota weight of user `u`: its capacity share, else its lifetime class's multiplier.
    pub fn capacity_share(&self, user: u32) -> f64 {
        if self.capacity_shares.is_empty() {
            self.quota_classes[self.class_of(user)]
        } else {
            self.capacity_shares[user as usize % self.capacity_shares.len()]
        }
    }

    /// Checks every parameter; errors name the parameter and the allowed range.
    pub fn validate(&self) -> Result<(), BiosError> {
        let bad = |name, value: String, reason: &str| {
            Err(BiosError::Parameter { name, value, reason: reason.to_string() })
        };
        for (name, value) in [
            ("nodes", self.nodes as u64),
            ("users_per_node", self.users_per_node as u64),
            ("threads_per_user", self.threads_per_user as u64),
            ("file_bytes", self.file_bytes),
            ("rows_per_turn", self.rows_per_turn as u64),
            ("samples", self.samples as u64),
        ] {
            if value == 0 {
                return bad(name, "0".into(), "must be at least 1");
            }
        }
        if self.stripe_count == 0 || !self.nodes.is_multiple_of(self.stripe_count) {
            return bad(
                "stripe_count",
                self.stripe_count.to_string(),
                &format!("must divide the node count {}", self.nodes),
            );
        }
        if !(1..=4).contains(&self.configuration) {
            return bad("configuration", self.configuration.to_string(), "is 1, 2, 3 or 4");
        }
        self.validate_weights()?;
        self.validate_fractions()
    }

    /// Share and class lists: positive finite weights, no longer than there are users.
    fn validate_weights(&self) -> Result<(), BiosError> {
        for (name, weights, may_be_empty) in [
            ("write_shares", &self.write_shares, false),
            ("capacity_shares", &self.capacity_shares, true),
            ("quota_classes", &self.quota_classes, false),
        ] {
            let positive = weights.iter().all(|w| w.is_finite() && *w > 0.0);
            if !positive || (weights.is_empty() && !may_be_empty) {
                return Err(BiosError::Parameter {
                    name,
                    value: format!("{weights:?}"),
                    reason: "needs weights that are finite and > 0 (at least one)".into(),
                });
            }
            if name != "quota_classes" && weights.len() > self.users() as usize {
                return Err(BiosError::Parameter {
                    name,
                    value: format!("{} weights", weights.len()),
                    reason: format!("at most one per user ({} users)", self.users()),
                });
            }
        }
        Ok(())
    }

    /// Fractions and run length: delete fraction and utilisation in (0, 1], noise ≥ 0.
    fn validate_fractions(&self) -> Result<(), BiosError> {
        let bad = |name, value: f64, reason: &str| {
            Err(BiosError::Parameter { name, value: value.to_string(), reason: reason.into() })
        };
        if let DeleteRule::OldestFraction { fraction } = self.delete_rule {
            if !(fraction > 0.0 && fraction <= 1.0) {
                return bad("delete_fraction", fraction, "must be in (0, 1]");
            }
        }
        if !(self.device_utilisation > 0.0 && self.device_utilisation <= 1.0) {
            return bad("device_utilisation", self.device_utilisation, "must be in (0, 1]");
        }
        if !(self.device_writes.is_finite() && self.device_writes > 0.0) {
            return bad("device_writes", self.device_writes, "must be finite and > 0");
        }
        if !(self.lifetime_estimate_noise.is_finite() && self.lifetime_estimate_noise >= 0.0) {
            return bad("lifetime_estimate_noise", self.lifetime_estimate_noise, "must be ≥ 0");
        }
        Ok(())
    }
}

struct User {
    key: StreamKey,
    pool: u16,
    quota_bytes: u64,
    used_bytes: u64,
    /// Completed files, oldest first: (file index, completion time).
    files: VecDeque<(usize, u64)>,
    /// Host bytes written (whole pages), files deleted and the sum of their lifetimes.
    host_bytes: u64,
    files_deleted: u64,
    lifetime_sum_ns: u64,
}

struct Thread {
    user: u32,
    job: StreamKey,
    ready_ns: u64,
    /// Index into `files` of the file being written.
    file: Option<usize>,
    next_chunk: usize,
    file_started_ns: u64,
    /// Time the current file spent waiting for its rows (its write latency so far).
    file_latency_ns: u64,
    /// Position in the service order: ready time plus a random offset within one round.
    order_key: u64,
    /// The user's write share ÷ the mean share: the order key advances this much slower.
    rate_weight: f64,
}

struct FileSlot {
    layout: StripedFile,
    /// Stream per SSD of the pool.
    streams: Vec<u16>,
}

/// Users with their pools and quotas: per pool, quotas plus the data that can be in flight fill
/// `device_utilisation` of the pool's logical capacity, shared in proportion to the users'
/// capacity shares (by default their lifetime classes' multipliers).
fn users_with_quotas(params: &BiosParams, pool_bytes: u64) -> Result<Vec<User>, BiosError> {
    let pools = params.pools() as u32;
    let mut users: Vec<User> = (0..params.users())
        .map(|u| User {
            key: StreamKey(u as u64),
            pool: (u % pools) as u16,
            quota_bytes: 0,
            used_bytes: 0,
            files: VecDeque::new(),
            host_bytes: 0,
            files_deleted: 0,
            lifetime_sum_ns: 0,
        })
        .collect();
    for pool in 0..pools as u16 {
        let members: Vec<u32> =
            (0..params.users()).filter(|&u| users[u as usize].pool == pool).collect();
        // Each user may hold one finished file over quota plus one file in flight per thread.
        let in_flight =
            members.len() as u64 * (params.threads_per_user as u64 + 1) * params.file_bytes;
        let budget = (pool_bytes as f64 * params.device_utilisation) as u64;
        if budget <= in_flight {
            return Err(BiosError::Parameter {
                name: "file_bytes",
                value: params.file_bytes.to_string(),
                reason: format!(
                    "the pool's capacity × device_utilisation ({budget} B, blocks per SSD {}) \
                     cannot hold the {in_flight} B in flight (one file per thread plus one per \
                     user); use smaller files, fewer users or threads, or more capacity",
                    params.ssd.blocks
                ),
            });
        }
        let weights: f64 = members.iter().map(|&u| params.capacity_share(u)).sum();
        for &u in &members {
            let share = params.capacity_share(u) / weights;
            let quota = ((budget - in_flight) as f64 * share) as u64;
            if quota < params.file_bytes {
                // A user whose quota cannot hold one file would delete every file it writes.
                return Err(BiosError::Parameter {
                    name: "file_bytes",
                    value: params.file_bytes.to_string(),
                    reason: format!(
                        "larger than user {u}'s quota of {quota} B (pool capacity × \
                         device_utilisation minus data in flight, shared by capacity shares); \
                         use smaller files, fewer users or threads, or more capacity"
                    ),
                });
            }
            users[u as usize].quota_bytes = quota;
        }
    }
    Ok(users)
}

/// T threads per user; users start in id order, so Algorithm 1 registers them in that order.
fn closed_loop_threads(params: &BiosParams) -> Vec<Thread> {
    let mean_share =
        (0..params.users()).map(|u| params.write_share(u)).sum::<f64>() / params.users() as f64;
    let mut threads =
        Vec::with_capacity(params.users() as usize * params.threads_per_user as usize);
    for u in 0..params.users() {
        for t in 0..params.threads_per_user {
            let position = threads.len() as u64;
            threads.push(Thread {
                user: u,
                job: StreamKey(((u as u64) << 16) | t as u64),
                ready_ns: position,
                file: None,
                next_chunk: 0,
                file_started_ns: 0,
                file_latency_ns: 0,
                order_key: position,
                rate_weight: params.write_share(u) / mean_share,
            });
        }
    }
    threads
}

/// Each user's quota in bytes, as a run sets them: checks the parameters and that the users'
/// files fit their quotas before anything runs.
pub fn user_quotas(params: &BiosParams) -> Result<Vec<u64>, BiosError> {
    params.validate()?;
    let volume = Volume::with_file_system(
        &params.ssd,
        params.nodes as usize,
        params.stripe_unit_bytes,
        params.fs,
    )?;
    let users = users_with_quotas(params, volume.logical_bytes() / params.pools() as u64)?;
    Ok(users.iter().map(|u| u.quota_bytes).collect())
}

/// Runs the workload under `mapping`.
pub fn run(params: &BiosParams, mapping: Mapping) -> Result<RunReport, BiosError> {
    params.validate()?;
    let started = crate::report::Stopwatch::start();
    let mut state = RunState::new(params, mapping)?;
    while state.host_pages < state.total_host_pages {
        state.serve_next_thread()?;
    }
    Ok(state.finish(mapping, started))
}

/// The state of one closed-loop run: the volume, its users and threads, and what was measured.
struct RunState<'a> {
    params: &'a BiosParams,
    volume: Volume,
    mapper: StreamMapper,
    rng: rand_chacha::ChaCha8Rng,
    users: Vec<User>,
    threads: Vec<Thread>,
    page_bytes: u64,
    chunk_bytes: u64,
    chunks_per_file: usize,
    total_host_pages: u64,
    warmup_host_pages: u64,
    sampler: Sampler,
    /// When each SSD is done with the stripe units issued to it so far.
    ssd_free_ns: Vec<u64>,
    /// Queued device model per SSD (empty under the fluid model), and the buffer its NAND
    /// operations are drained into after each stripe unit.
    devices: Vec<QueuedDevice>,
    nand_ops: Vec<NandOp>,
    round_ns: u64,
    files: Vec<FileSlot>,
    /// Indices into `files` of deleted files, reused by the next files opened.
    spare_files: Vec<usize>,
    /// Counters and time at the start of the measurement window, once reached.
    window: Option<(crate::ssd::SsdCounters, u64)>,
    /// Write latency of each file started in the measurement window.
    latencies_ns: Vec<u64>,
    host_pages: u64,
    now_ns: u64,
}

impl<'a> RunState<'a> {
    /// Sets up the volume, the stream mapper, the users with their quotas and the threads.
    fn new(params: &'a BiosParams, mapping: Mapping) -> Result<RunState<'a>, BiosError> {
        let mut volume = Volume::with_file_system(
            &params.ssd,
            params.nodes as usize,
            params.stripe_unit_bytes,
            params.fs,
        )?;
        let devices = queued_devices(params, &mut volume)?;
        let page_bytes = params.ssd.page_bytes as u64;
        let chunk_bytes = volume.chunk_bytes();
        let chunks_per_file = params.file_bytes.div_ceil(chunk_bytes) as usize;
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
        let mut mapper = StreamMapper::new(mapping, params.nodes as usize, params.ssd.streams);
        if params.lifetime_estimate_noise > 0.0 {
            mapper.set_estimate_noise(params.lifetime_estimate_noise, params.seed ^ 0x6c69_6665);
        }
        let users = users_with_quotas(params, volume.logical_bytes() / params.pools() as u64)?;
        for user in &users {
            mapper.lifetimes.set_quota(user.key, user.quota_bytes);
        }
        let threads = closed_loop_threads(params);
        let total_host_pages = total_host_pages(params, &volume)?;
        let warmup_host_pages = crate::report::SteadyWindow::start_host_pages(total_host_pages);
        let sampler =
            Sampler::new(total_host_pages, params.samples, volume.logical_bytes(), page_bytes);
        Ok(RunState {
            params,
            ssd_free_ns: vec![0u64; params.nodes as usize],
            devices,
            nand_ops: Vec::new(),
            round_ns: round_ns(params, &volume),
            volume,
            mapper,
            rng,
            users,
            threads,
            page_bytes,
            chunk_bytes,
            chunks_per_file,
            total_host_pages,
            warmup_host_pages,
            sampler,
            files: Vec::new(),
            spare_files: Vec::new(),
            window: None,
            latencies_ns: Vec::new(),
            host_pages: 0,
            now_ns: 0,
        })
    }

    /// Serves the next thread: opens a file if needed, issues its turn of stripe rows
    /// (`rows_per_turn`, fewer at the file's end), completes the file, samples.
    fn serve_next_thread(&mut self) -> Result<(), BiosError> {
        // The thread first in the service order issues next (ties: lowest index).
        let thread_index =
            (0..self.threads.len()).min_by_key(|&i| (self.threads[i].order_key, i)).unwrap();
        let ready = self.threads[thread_index].ready_ns;
        self.now_ns = self.now_ns.max(ready);
        if self.threads[thread_index].file.is_none() {
            self.open_file(thread_index, ready);
        }
        let file_index = self.threads[thread_index].file.unwrap();
        let host_pages_before = self.host_pages;
        let mut done = ready;
        for _ in 0..self.params.rows_per_turn {
            done = self.issue_stripe_row(thread_index, file_index, done)?;
            if self.threads[thread_index].next_chunk == self.chunks_per_file {
                break;
            }
        }
        let user = self.threads[thread_index].user as usize;
        self.users[user].host_bytes += (self.host_pages - host_pages_before) * self.page_bytes;
        let (next_ready, order_key) = self.next_issue(thread_index, ready, done);
        self.threads[thread_index].ready_ns = next_ready;
        self.threads[thread_index].file_latency_ns += done - ready;
        self.threads[thread_index].order_key = order_key;

        if self.threads[thread_index].next_chunk == self.chunks_per_file {
            self.complete_file(thread_index, file_index, done);
        }

        let counters = self.volume.total_counters();
        if self.window.is_none() && self.host_pages >= self.warmup_host_pages {
            self.window = Some((counters, self.now_ns));
        }
        self.sampler.observe(&counters, self.now_ns);
        Ok(())
    }

    /// When the thread issues its next turn, and its place in the service order (that time plus
    /// a random offset within one round). A thread of weight 1 (equal shares) issues when its
    /// turn is done. A thread of weight w issues after 1/w of its turn's wait: with weight 2 it
    /// keeps two requests in flight and, waiting in the same device queues as everyone, writes
    /// twice as fast (Little's law); with weight ½ it pauses as long as it waited.
    fn next_issue(&mut self, thread_index: usize, ready: u64, done: u64) -> (u64, u64) {
        let offset = self.rng.gen_range(0..=self.round_ns);
        let weight = self.threads[thread_index].rate_weight;
        if weight == 1.0 {
            (done, done + offset)
        } else {
            let next = ready + ((done - ready) as f64 / weight) as u64;
            (next, next + offset)
        }
    }

    /// Opens a new file for a thread: picks the layout and a stream per SSD of the pool.
    fn open_file(&mut self, thread_index: usize, ready: u64) {
        let params = self.params;
        let user = &self.users[self.threads[thread_index].user as usize];
        let layout = StripedFile {
            pool_first_ssd: user.pool * params.stripe_count,
            stripe_count: params.stripe_count,
            start: self.rng.gen_range(0..params.stripe_count),
            chunks: Vec::with_capacity(self.chunks_per_file),
        };
        let streams: Vec<u16> = (0..params.stripe_count as usize)
            .map(|i| {
                self.mapper.open(
                    layout.pool_first_ssd as usize + i,
                    user.key,
                    self.threads[thread_index].job,
                    ready,
                )
            })
            .collect();
        let slot = FileSlot { layout, streams };
        let index = match self.spare_files.pop() {
            Some(i) => {
                self.files[i] = slot;
                i
            }
            None => {
                self.files.push(slot);
                self.files.len() - 1
            }
        };
        let thread = &mut self.threads[thread_index];
        thread.file = Some(index);
        thread.next_chunk = 0;
        thread.file_started_ns = ready;
        thread.file_latency_ns = 0;
    }

    /// Issues one stripe row of a thread's file; returns when the slowest of its units is done.
    fn issue_stripe_row(
        &mut self,
        thread_index: usize,
        file_index: usize,
        ready: u64,
    ) -> Result<u64, BiosError> {
        // Issue one stripe row: the next chunk on each SSD of the pool, in parallel (what a
        // striping client does with a large write); the thread waits for the slowest.
        let params = self.params;
        let user_key = self.users[self.threads[thread_index].user as usize].key;
        let row = (params.stripe_count as usize)
            .min(self.chunks_per_file - self.threads[thread_index].next_chunk);
        let mut done = ready;
        for _ in 0..row {
            let ordinal = self.threads[thread_index].next_chunk;
            let file = &mut self.files[file_index];
            let ssd = file.layout.ssd_of(ordinal);
            let Some(chunk) = self.volume.allocate_chunk(ssd) else {
                return Err(BiosError::OutOfSpace {
                    ssd,
                    user: self.threads[thread_index].user,
                    file: file_index as u64,
                });
            };
            let bytes = self.chunk_bytes.min(params.file_bytes - ordinal as u64 * self.chunk_bytes);
            let pages = bytes.div_ceil(self.page_bytes) as u32;
            let stream = file.streams[ssd - file.layout.pool_first_ssd as usize];
            file.layout.chunks.push(chunk);
            done = done.max(self.write_unit(ssd, chunk, pages, stream, ready));
            self.host_pages += pages as u64;
            self.mapper.lifetimes.wrote(user_key, bytes, ready);
            self.threads[thread_index].next_chunk += 1;
        }
        Ok(done)
    }

    /// Completes a thread's file at `done`: accounts it, records its latency, enforces the quota.
    fn complete_file(&mut self, thread_index: usize, file_index: usize, done: u64) {
        let params = self.params;
        let thread = &mut self.threads[thread_index];
        thread.file = None;
        let in_window = self.window.is_some_and(|(_, t)| thread.file_started_ns >= t);
        if in_window {
            self.latencies_ns.push(thread.file_latency_ns);
        }
        let user = &mut self.users[thread.user as usize];
        user.used_bytes += params.file_bytes;
        user.files.push_back((file_index, done));
        if user.used_bytes <= user.quota_bytes {
            return;
        }
        let victims = match params.delete_rule {
            DeleteRule::OldestFraction { fraction } => {
                ((user.files.len() as f64 * fraction).ceil() as usize).max(1)
            }
            DeleteRule::OldestUntilWithinQuota => {
                (user.used_bytes - user.quota_bytes).div_ceil(params.file_bytes) as usize
            }
        };
        for _ in 0..victims.min(user.files.len()) {
            let (victim, written_at) = user.files.pop_front().expect("over quota with no file");
            self.volume.release_file(&self.files[victim].layout);
            self.files[victim].layout.chunks.clear();
            self.spare_files.push(victim);
            user.used_bytes -= params.file_bytes;
            user.files_deleted += 1;
            user.lifetime_sum_ns += done.saturating_sub(written_at);
            self.mapper.lifetimes.deleted(user.key, done.saturating_sub(written_at));
        }
    }

    /// Takes the last sample and reports the run, with WAF and throughput over the window.
    fn finish(mut self, mapping: Mapping, started: crate::report::Stopwatch) -> RunReport {
        let params = self.params;
        let end_ns = self.ssd_free_ns.iter().copied().max().unwrap_or(0).max(self.now_ns);
        let counters = self.volume.total_counters();
        self.sampler.force(&counters, end_ns);
        let (window_start, window_start_ns) =
            self.window.expect("run reached the measurement window");
        let (waf_steady, steady_window) = crate::report::SteadyWindow::measure(
            &window_start,
            &counters,
            self.volume.logical_bytes(),
            self.page_bytes,
        );
        let window_host_bytes = (counters.host_pages - window_start.host_pages) * self.page_bytes;
        let window_seconds = (end_ns - window_start_ns) as f64 / 1e9;
        RunReport {
            label: run_label(params, mapping),
            waf_steady,
            steady_window,
            waf_cumulative: counters.waf(),
            users: self.user_summaries(),
            host_pages: counters.host_pages,
            gc_copied_pages: counters.gc_copied_pages,
            erases: counters.erases,
            per_ssd: self.volume.ssds().iter().map(SsdSummary::of).collect(),
            samples: self.sampler.samples,
            throughput_mib_per_s: Some(
                window_host_bytes as f64 / (1024.0 * 1024.0) / window_seconds.max(1e-9),
            ),
            file_write_latency: LatencyPercentiles::from_ns(&mut self.latencies_ns),
            wall: Some(started.finish(&counters)),
        }
    }
}

impl RunState<'_> {
    /// Writes one stripe unit issued at `ready` and returns when its SSD is done with it.
    /// Fluid model: the SSD serves units in issue order, each taking the device time
    /// (`busy_ns`) its programs and the GC it waited for consumed. Queued model: the FTL's
    /// NAND operations go through the SSD's per-die queues ([`QueuedDevice`]).
    fn write_unit(&mut self, ssd: usize, chunk: u32, pages: u32, stream: u16, ready: u64) -> u64 {
        if self.devices.is_empty() {
            let busy_before = self.volume.ssds()[ssd].counters().busy_ns;
            self.volume.write(ssd, chunk, 0, pages, stream);
            let service = self.volume.ssds()[ssd].counters().busy_ns - busy_before;
            let start = self.ssd_free_ns[ssd].max(ready);
            self.ssd_free_ns[ssd] = start + service;
            return start + service;
        }
        self.volume.write(ssd, chunk, 0, pages, stream);
        self.volume.ssd_mut(ssd).take_ops(&mut self.nand_ops);
        let done = self.devices[ssd].apply(&self.nand_ops, ready);
        self.ssd_free_ns[ssd] = self.ssd_free_ns[ssd].max(self.devices[ssd].drained_ns());
        done
    }

    /// What each user was given (write share, quota) and what it did.
    fn user_summaries(&self) -> Vec<UserSummary> {
        self.users
            .iter()
            .enumerate()
            .map(|(u, user)| UserSummary {
                user: u as u32,
                write_share: self.params.write_share(u as u32),
                quota_bytes: user.quota_bytes,
                host_bytes: user.host_bytes,
                files_deleted: user.files_deleted,
                mean_file_lifetime_s: user.lifetime_sum_ns as f64
                    / 1e9
                    / user.files_deleted.max(1) as f64,
            })
            .collect()
    }
}

/// One queued device per SSD, with the SSDs logging their NAND operations for it; none under
/// the fluid model.
fn queued_devices(
    params: &BiosParams,
    volume: &mut Volume,
) -> Result<Vec<QueuedDevice>, BiosError> {
    let timing = &params.ssd.timing;
    if timing.device_model == DeviceModel::Fluid {
        return Ok(Vec::new());
    }
    // A GC episode cleaning 64 victims full of valid pages bounds every die's backlog.
    let episode_pages = params.ssd.pages_per_block as u64 * 64;
    let mut devices = Vec::with_capacity(params.nodes as usize);
    for ssd in 0..params.nodes as usize {
        volume.ssd_mut(ssd).record_ops(true);
        devices.push(
            QueuedDevice::new(timing, params.ssd.streams, episode_pages, timing.gc_preemption)
                .map_err(|e| BiosError::Parameter {
                    name: "ssd.timing",
                    value: format!("{timing:?}"),
                    reason: e.to_string(),
                })?,
        );
    }
    Ok(devices)
}

/// Host pages the whole run writes: `device_writes` times the volume's logical capacity.
fn total_host_pages(params: &BiosParams, volume: &Volume) -> Result<u64, BiosError> {
    let page_bytes = params.ssd.page_bytes as u64;
    let total_host_pages =
        (volume.logical_bytes() as f64 * params.device_writes / page_bytes as f64) as u64;
    if total_host_pages == 0 {
        return Err(BiosError::Parameter {
            name: "device_writes",
            value: params.device_writes.to_string(),
            reason: "the run would write no page".into(),
        });
    }
    Ok(total_host_pages)
}

/// Length of one round of the service order, the range of the random offset of each thread.
fn round_ns(params: &BiosParams, volume: &Volume) -> u64 {
    // One round: every thread of a pool has one stripe unit served on each SSD of the pool.
    // Requests issued within a round reach the SSDs in random order, as concurrent clients'
    // requests do; without this the closed loop degenerates into a fixed thread rotation that
    // puts the same users in the same blocks forever.
    let pools = params.pools();
    let threads_per_pool = (params.users() as u64 / pools as u64) * params.threads_per_user as u64;
    let chunk_service_ns =
        (volume.chunk_pages() as f64 * params.ssd.timing.page_program_us * 1000.0
            / params.ssd.timing.parallel_units.max(1) as f64) as u64;
    threads_per_pool * chunk_service_ns
}

/// Label of a run: mapping, configuration, stripe count, and the file system when not the base.
fn run_label(params: &BiosParams, mapping: Mapping) -> String {
    if params.fs == FileSystemModel::default() {
        format!("{} c{} sc{}", mapping.name(), params.configuration, params.stripe_count)
    } else {
        format!(
            "{} c{} sc{} {}",
            mapping.name(),
            params.configuration,
            params.stripe_count,
            params.fs.name()
        )
    }
}
