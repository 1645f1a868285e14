//! A queued device service model: NAND dies with FIFO queues, so that GC work delays the host
//! writes that need the same die, and foreground GC blocks the stream that needs a free block.
//!
//! Why: the fluid model ([`crate::ssd::NandTiming`], every operation costs latency ÷ dies of
//! device time) is work-conserving, so throughput is 1 ÷ (work per host page) and can only
//! track WAF. A real SSD loses more than its extra NAND work to GC: a victim block lives on one
//! die, so its reads and its erase queue on that die while the host write that needs the freed
//! block waits, and the other dies idle once the host has nothing else to give them (BIOS 5.2:
//! "the GC operation blocks the processing of incoming I/O requests until this operation is
//! done").
//!
//! The model (one per SSD, deterministic, no event queue: each die is a FIFO described by the
//! time it becomes free):
//! - `dies` dies; a block lives on die `block mod dies`.
//! - Programs (host pages and GC copy destinations) go to the dies round-robin (one write point
//!   rotating over the dies, as an FTL stripes a stream over per-die open blocks), so the 32
//!   pages of a 512 KiB stripe unit occupy 32 dies once each. Which erase block the data lands
//!   in is still decided by [`crate::ssd::Ssd`], so WAF does not depend on this model.
//! - A GC copy reads the page on the victim's die, then programs it on the next die of the
//!   rotation; an erase occupies the victim's die.
//! - Foreground GC ([`GcPreemption::Off`]): the GC work of an episode (the copies and erases
//!   the FTL did before handing a host stream a block) enters the die queues in order, and the
//!   stream that triggered it cannot program until the whole episode is done.
//! - [`GcPreemption::On`]: the episode's work goes to a per-die backlog instead; host programs
//!   go ahead of it, and a die works off its backlog only while it has no host program queued
//!   (GC operations are suspendable, as program/erase suspend allows). The triggering stream
//!   does not wait — the FTL's logical free count is already above the reserve. It may borrow
//!   the reserve once: when the next episode starts while backlog remains, the remaining
//!   backlog is forced into the queues and the stream that triggered the new episode waits for
//!   it (free blocks are at the reserve; the reserve cannot be lent twice). So at most one
//!   episode is ever backlogged.

use crate::ssd::{NandOp, NandTiming};

/// Which time model a run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceModel {
    /// Every NAND operation costs latency ÷ dies of device time; SSDs serve stripe units in
    /// issue order (work-conserving: throughput tracks WAF).
    Fluid,
    /// Per-die FIFO queues with foreground GC blocking ([`QueuedDevice`]).
    #[default]
    Queued,
}

impl DeviceModel {
    pub fn name(self) -> &'static str {
        match self {
            DeviceModel::Fluid => "fluid",
            DeviceModel::Queued => "queued",
        }
    }

    pub fn parse(text: &str) -> Option<DeviceModel> {
        match text {
            "fluid" => Some(DeviceModel::Fluid),
            "queued" => Some(DeviceModel::Queued),
            _ => None,
        }
    }
}

/// Whether host programs may go ahead of queued GC work (see the module doc for the rule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GcPreemption {
    /// Foreground GC: the triggering stream waits for the whole episode.
    #[default]
    Off,
    /// Host programs first; GC works off in idle die time; one episode may be outstanding.
    On,
}

/// Why a queued device cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("device timing {field} = {value}: {reason}")]
    Timing { field: &'static str, value: f64, reason: &'static str },
}

/// The state of one SSD's dies.
#[derive(Clone, Debug)]
pub struct QueuedDevice {
    read_ns: u64,
    program_ns: u64,
    erase_ns: u64,
    preemption: GcPreemption,
    /// When each die is done with the operations queued on it so far.
    die_free_ns: Vec<u64>,
    /// GC work (ns) waiting for idle time on each die (preemption on only).
    backlog_ns: Vec<u64>,
    /// Upper bound of one backlog entry: one episode's work on one die.
    backlog_bound_ns: u64,
    /// Earliest time each host stream may program again (after the GC it waits for).
    stream_ready_ns: Vec<u64>,
    /// Next die of the program rotation.
    next_die: u32,
    /// GC episode being collected: the time it was submitted and when its work is done.
    episode: Option<Episode>,
    /// Host programs served.
    pub host_programs: u64,
    /// Total time host programs waited for the GC episode their own stream triggered (ns).
    pub host_wait_for_gc_ns: u64,
}

#[derive(Clone, Copy, Debug)]
struct Episode {
    submit_ns: u64,
    done_ns: u64,
}

impl QueuedDevice {
    /// A device with `streams` host streams whose GC episodes never exceed
    /// `max_episode_pages` copies (a bound used to check the backlog stays bounded).
    pub fn new(
        timing: &NandTiming,
        streams: u16,
        max_episode_pages: u64,
        preemption: GcPreemption,
    ) -> Result<QueuedDevice, DeviceError> {
        let check = |field, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok((value * 1000.0).round() as u64)
            } else {
                Err(DeviceError::Timing { field, value, reason: "must be positive" })
            }
        };
        let read_ns = check("page_read_us", timing.page_read_us)?;
        let program_ns = check("page_program_us", timing.page_program_us)?;
        let erase_ns = check("block_erase_us", timing.block_erase_us)?;
        if timing.parallel_units == 0 {
            return Err(DeviceError::Timing {
                field: "parallel_units",
                value: 0.0,
                reason: "needs at least one die",
            });
        }
        let dies = timing.parallel_units as usize;
        Ok(QueuedDevice {
            read_ns,
            program_ns,
            erase_ns,
            preemption,
            die_free_ns: vec![0; dies],
            backlog_ns: vec![0; dies],
            // A die can hold every read, program and erase of an episode in the worst case.
            backlog_bound_ns: max_episode_pages * (read_ns + program_ns) + 64 * erase_ns,
            stream_ready_ns: vec![0; streams as usize],
            next_die: 0,
            episode: None,
            host_programs: 0,
            host_wait_for_gc_ns: 0,
        })
    }

    pub fn dies(&self) -> u32 {
        self.die_free_ns.len() as u32
    }

    /// Applies the operations the FTL performed for host writes submitted at `submit_ns`;
    /// returns when the last host program among them is done (`submit_ns` if none).
    pub fn apply(&mut self, ops: &[NandOp], submit_ns: u64) -> u64 {
        let mut done = submit_ns;
        for op in ops {
            match *op {
                NandOp::HostProgram { stream } => {
                    done = done.max(self.host_program(stream, submit_ns));
                }
                NandOp::GcCopy { victim } => self.gc_copy(victim, submit_ns),
                NandOp::Erase { block } => self.erase(block, submit_ns),
            }
        }
        done
    }

    /// One host page program of `stream`; returns when it is done.
    pub fn host_program(&mut self, stream: u16, submit_ns: u64) -> u64 {
        let die = self.rotate();
        self.host_program_on_die(stream, die, submit_ns)
    }

    /// One host page program of `stream` on `die`; returns when it is done.
    pub fn host_program_on_die(&mut self, stream: u16, die: u32, submit_ns: u64) -> u64 {
        let s = stream as usize;
        assert!(s < self.stream_ready_ns.len(), "stream {stream} beyond the device");
        if let Some(episode) = self.episode.take() {
            // The FTL finished the episode before this program: the stream that needed the
            // block waits for it (off) or goes ahead of it (on; see `begin_episode`).
            // Off: `done_ns` is the end of the episode's work; on: the end of the previous
            // episode's backlog it forced (the reserve cannot be lent twice).
            self.stream_ready_ns[s] = self.stream_ready_ns[s].max(episode.done_ns);
        }
        let d = die as usize;
        let ready = submit_ns.max(self.stream_ready_ns[s]);
        if self.preemption == GcPreemption::On {
            // Idle time before this program works off backlog (GC runs when no host op waits).
            let idle = ready.saturating_sub(self.die_free_ns[d]);
            let worked = idle.min(self.backlog_ns[d]);
            self.backlog_ns[d] -= worked;
            self.die_free_ns[d] += worked;
        }
        let unblocked = submit_ns.max(self.die_free_ns[d]);
        let start = ready.max(self.die_free_ns[d]);
        self.host_wait_for_gc_ns += start - unblocked.min(start);
        self.host_programs += 1;
        self.die_free_ns[d] = start + self.program_ns;
        self.die_free_ns[d]
    }

    /// One GC copy out of `victim`: read on its die, program on the next die of the rotation.
    pub fn gc_copy(&mut self, victim: u32, submit_ns: u64) {
        let submit = self.begin_episode(submit_ns);
        let read_die = (victim % self.dies()) as usize;
        let program_die = self.rotate() as usize;
        match self.preemption {
            GcPreemption::Off => {
                let read_done = self.die_free_ns[read_die].max(submit) + self.read_ns;
                self.die_free_ns[read_die] = read_done;
                let program_done = self.die_free_ns[program_die].max(read_done) + self.program_ns;
                self.die_free_ns[program_die] = program_done;
                self.extend_episode(program_done);
            }
            GcPreemption::On => {
                self.add_backlog(read_die, self.read_ns);
                self.add_backlog(program_die, self.program_ns);
            }
        }
    }

    /// Erase of `block` (after its copies) on its die.
    pub fn erase(&mut self, block: u32, submit_ns: u64) {
        let submit = self.begin_episode(submit_ns);
        let die = (block % self.dies()) as usize;
        match self.preemption {
            GcPreemption::Off => {
                let done = self.die_free_ns[die].max(submit) + self.erase_ns;
                self.die_free_ns[die] = done;
                self.extend_episode(done);
            }
            GcPreemption::On => self.add_backlog(die, self.erase_ns),
        }
    }

    /// When every die is done with everything queued (backlog included).
    pub fn drained_ns(&self) -> u64 {
        self.die_free_ns.iter().zip(&self.backlog_ns).map(|(&f, &b)| f + b).max().unwrap_or(0)
    }

    /// Starts an episode at the first GC operation after a host program; returns the time its
    /// work may start. With preemption, an earlier episode's remaining backlog is forced first.
    fn begin_episode(&mut self, submit_ns: u64) -> u64 {
        if let Some(episode) = self.episode {
            return episode.submit_ns;
        }
        let mut forced_done = submit_ns;
        if self.preemption == GcPreemption::On {
            for d in 0..self.die_free_ns.len() {
                if self.backlog_ns[d] > 0 {
                    self.die_free_ns[d] = self.die_free_ns[d].max(submit_ns) + self.backlog_ns[d];
                    self.backlog_ns[d] = 0;
                    forced_done = forced_done.max(self.die_free_ns[d]);
                }
            }
        }
        self.episode = Some(Episode { submit_ns, done_ns: forced_done });
        submit_ns
    }

    fn extend_episode(&mut self, done_ns: u64) {
        let episode = self.episode.as_mut().expect("GC work outside an episode");
        episode.done_ns = episode.done_ns.max(done_ns);
    }

    fn add_backlog(&mut self, die: usize, work_ns: u64) {
        self.backlog_ns[die] += work_ns;
        assert!(
            self.backlog_ns[die] <= self.backlog_bound_ns,
            "GC backlog on die {die} exceeds one episode's work"
        );
    }

    fn rotate(&mut self) -> u32 {
        let die = self.next_die;
        self.next_die = (self.next_die + 1) % self.dies();
        die
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(dies: u32) -> NandTiming {
        NandTiming { parallel_units: dies, ..NandTiming::default() }
    }

    fn device(dies: u32, preemption: GcPreemption) -> QueuedDevice {
        QueuedDevice::new(&timing(dies), 2, 256 * 8, preemption).unwrap()
    }

    #[test]
    fn without_gc_throughput_is_dies_times_page_over_program_time() {
        // Saturate: submit everything at time 0, 100 pages per die.
        let mut dev = device(32, GcPreemption::Off);
        let pages = 3200u64;
        let done = (0..pages).map(|_| dev.host_program(0, 0)).max().unwrap();
        let t = NandTiming::default();
        let bytes_per_s = pages as f64 * 16384.0 / (done as f64 / 1e9);
        let expected = 32.0 * 16384.0 / (t.page_program_us / 1e6);
        assert!((bytes_per_s / expected - 1.0).abs() < 1e-9, "{bytes_per_s} vs {expected}");
        // ≈ 1.05 GB/s: the PM963-class calibration point.
        assert!((1.0e9..1.1e9).contains(&bytes_per_s));
        assert_eq!(dev.host_wait_for_gc_ns, 0);
    }

    #[test]
    fn gc_on_one_die_delays_only_writes_that_need_that_die() {
        let t = NandTiming::default();
        let program_ns = (t.page_program_us * 1e3) as u64;
        let erase_ns = (t.block_erase_us * 1e3) as u64;
        let read_ns = (t.page_read_us * 1e3) as u64;
        let mut dev = device(4, GcPreemption::Off);
        // Victim block 6 lives on die 2: its copy reads there (the programs rotate from die 0),
        // then its erase.
        dev.gc_copy(6, 0);
        dev.erase(6, 0);
        // Stream 0 triggered the episode: it waits for all of it, even on an idle die.
        assert_eq!(dev.host_program_on_die(0, 1, 0), read_ns + erase_ns + program_ns);
        // Stream 1 did not trigger the GC: on die 3 (no GC work) it is not delayed at all.
        assert_eq!(dev.host_program_on_die(1, 3, 0), program_ns);
        // On die 2 it queues behind the read and the erase.
        assert_eq!(dev.host_program_on_die(1, 2, 0), read_ns + erase_ns + program_ns);
        // On die 0 behind the copy's program, which waited for its read.
        assert_eq!(dev.host_program_on_die(1, 0, 0), read_ns + 2 * program_ns);
    }

    #[test]
    fn foreground_gc_blocks_the_triggering_stream_for_the_whole_episode() {
        let mut dev = device(32, GcPreemption::Off);
        let ops: Vec<NandOp> = (0..20)
            .map(|_| NandOp::GcCopy { victim: 5 })
            .chain([NandOp::Erase { block: 5 }, NandOp::HostProgram { stream: 0 }])
            .collect();
        let done = dev.apply(&ops, 0);
        let t = NandTiming::default();
        // Reads are serial on die 5, then the erase: the host program starts after them.
        let critical = (20.0 * t.page_read_us + t.block_erase_us + t.page_program_us) * 1e3;
        assert!(done as f64 >= critical, "{done} < {critical}");
        assert!(dev.host_wait_for_gc_ns > 0);
    }

    /// Host programs arriving with gaps (a lightly loaded device) while GC episodes run:
    /// returns each program's latency (done − submit).
    fn latencies(preemption: GcPreemption) -> Vec<u64> {
        let mut dev = device(8, preemption);
        let mut out = Vec::new();
        let mut now = 0u64;
        for round in 0..50u32 {
            if round % 5 == 0 {
                let victim = round / 5;
                let ops: Vec<NandOp> = (0..40)
                    .map(|_| NandOp::GcCopy { victim })
                    .chain([NandOp::Erase { block: victim }])
                    .collect();
                dev.apply(&ops, now);
            }
            for _ in 0..8 {
                let done = dev.host_program(0, now);
                out.push(done - now);
            }
            now += 20_000_000; // 20 ms between bursts: the device idles in between.
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn preemption_lowers_the_host_latency_tail_above_the_reserve() {
        let off = latencies(GcPreemption::Off);
        let on = latencies(GcPreemption::On);
        let p99 = |v: &[u64]| v[(v.len() * 99).div_ceil(100) - 1];
        assert!(p99(&on) < p99(&off), "p99 on {} off {}", p99(&on), p99(&off));
        // Work is not lost: with preemption the GC still happens, in the idle time.
        let program_ns = (NandTiming::default().page_program_us * 1e3) as u64;
        assert_eq!(on[0], program_ns);
    }

    #[test]
    fn a_second_episode_forces_the_first_ones_backlog() {
        let mut dev = device(4, GcPreemption::On);
        dev.apply(&[NandOp::Erase { block: 1 }], 0);
        // Preemption on: the host goes ahead of the erase on die 1.
        let program_ns = (NandTiming::default().page_program_us * 1e3) as u64;
        assert_eq!(dev.host_program_on_die(0, 1, 0), program_ns);
        // Next episode at time 0: the first erase is forced; every stream waits for it.
        dev.apply(&[NandOp::Erase { block: 2 }], 0);
        let erase_ns = (NandTiming::default().block_erase_us * 1e3) as u64;
        assert!(dev.host_program_on_die(1, 3, 0) >= program_ns + erase_ns);
    }

    #[test]
    fn bad_timing_is_refused() {
        let t = NandTiming { page_program_us: 0.0, ..NandTiming::default() };
        let error = QueuedDevice::new(&t, 1, 1, GcPreemption::Off).unwrap_err().to_string();
        assert!(error.contains("page_program_us"), "{error}");
    }
}
