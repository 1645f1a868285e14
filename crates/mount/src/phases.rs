//! The mount's I/O phases, reported to the data scheduler (docs/design/ias.md, "The mount").
//!
//! A mount's writes always go to the burst buffer (its files are shared by every node's mount
//! before any commit), but the scheduler must still see them: IAS's Algorithm 1 counts the jobs
//! writing to each tier, and a job checkpointing through the mount is one of them. A phase here
//! is a burst of writes: it begins with the first write after quiet and ends once no write came
//! for [`PhaseReporting::quiet`] (or at unmount). The write path only updates a counter under a
//! lock and wakes the reporter thread (`spillway-mount-phases`), which talks to the scheduler;
//! a slow or absent scheduler never slows a write.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spillway_client::{PhaseBegin, PhaseEnd, Tier, TierService, TieringStrategy};
use spillway_types::EpochId;

/// Writes further apart than this are two phases (the simulator's `--phase-gap` default).
pub const PHASE_QUIET_DEFAULT: Duration = Duration::from_secs(1);

/// Where and as what a mount reports its phases.
#[derive(Clone)]
pub struct PhaseReporting {
    pub service: Arc<dyn TierService>,
    /// The job the mount serves (the Slurm job id).
    pub job: String,
    /// Processes of the job (IAS's runtime reports it with every phase).
    pub processes: u32,
    pub quiet: Duration,
}

impl std::fmt::Debug for PhaseReporting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseReporting")
            .field("job", &self.job)
            .field("processes", &self.processes)
            .field("quiet", &self.quiet)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// Bytes written in the current phase; `None`: no phase.
    phase_bytes: Option<u64>,
    began: Option<Instant>,
    last_write: Option<Instant>,
    stop: bool,
}

/// The reporter of one mount: [`Phases::wrote`] on the write path, a thread for the rest.
pub(crate) struct Phases {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Phases {
    /// Starts the reporter for the mount's data epoch; `client` names this mount to the
    /// scheduler (a phase of several nodes' mounts of one job is one phase).
    pub(crate) fn start(
        reporting: PhaseReporting,
        epoch: EpochId,
        client: u64,
    ) -> std::io::Result<Phases> {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let reporter = Reporter { reporting, epoch, client, shared: shared.clone() };
        let thread = std::thread::Builder::new()
            .name("spillway-mount-phases".into())
            .spawn(move || reporter.run())?;
        Ok(Phases { shared, thread: Some(thread) })
    }

    /// A write of `bytes` was accepted: no I/O, one short lock.
    pub(crate) fn wrote(&self, bytes: u64) {
        let (state, wake) = &*self.shared;
        let mut state = state.lock();
        let now = Instant::now();
        state.last_write = Some(now);
        match &mut state.phase_bytes {
            Some(total) => *total = total.saturating_add(bytes),
            None => {
                state.phase_bytes = Some(bytes);
                state.began = Some(now);
                wake.notify_one();
            }
        }
    }
}

impl Drop for Phases {
    /// Ends the phase in progress and leaves the scheduler's count of active jobs.
    fn drop(&mut self) {
        let (state, wake) = &*self.shared;
        state.lock().stop = true;
        wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Reporter {
    reporting: PhaseReporting,
    epoch: EpochId,
    client: u64,
    shared: Arc<(Mutex<State>, Condvar)>,
}

impl Reporter {
    fn run(self) {
        let (state, wake) = &*self.shared;
        let mut reported_begin = false;
        let mut last_phase_bytes = 0;
        loop {
            let mut guard = state.lock();
            // Wait for a phase to begin (or, in one, for the quiet that ends it).
            let ended = loop {
                match (guard.phase_bytes, guard.last_write) {
                    // A phase not reported yet is reported first, even once stopping: a mount
                    // may write and unmount before this thread ever ran.
                    (Some(_), _) if !reported_begin => break false,
                    _ if guard.stop => break true,
                    (Some(_), Some(last)) => {
                        let quiet_for = last.elapsed();
                        if quiet_for >= self.reporting.quiet {
                            break true;
                        }
                        wake.wait_for(&mut guard, self.reporting.quiet - quiet_for);
                    }
                    _ => {
                        wake.wait(&mut guard);
                    }
                }
            };
            if !ended {
                drop(guard);
                self.begin(last_phase_bytes);
                reported_begin = true;
                continue;
            }
            let stop = guard.stop;
            let bytes = guard.phase_bytes.take();
            let seconds = match (guard.began.take(), guard.last_write) {
                (Some(began), Some(last)) => last.saturating_duration_since(began).as_secs_f64(),
                _ => 0.0,
            };
            drop(guard);
            if let (Some(bytes), true) = (bytes, reported_begin) {
                self.end(bytes, seconds);
                last_phase_bytes = bytes;
            }
            reported_begin = false;
            if stop {
                if let Err(error) = self.reporting.service.leave(&self.reporting.job, self.client) {
                    tracing::warn!(%error, "mount phases: leaving the scheduler's active jobs");
                }
                return;
            }
        }
    }

    fn begin(&self, expected_bytes: u64) {
        let begin = PhaseBegin {
            job: self.reporting.job.clone(),
            client: self.client,
            processes: self.reporting.processes.max(1),
            epoch: self.epoch,
            // The mount writes the burst buffer whatever a strategy would say.
            strategy: Some(TieringStrategy::HighPriority),
            expected_bytes,
            node_local_free_bytes: 0,
            node_local_bandwidth_bytes_per_s: 0,
        };
        if let Err(error) = self.reporting.service.begin_phase(&begin) {
            tracing::warn!(%error, "mount phases: reporting a phase's beginning");
        }
    }

    fn end(&self, bytes: u64, seconds: f64) {
        let end = PhaseEnd {
            job: self.reporting.job.clone(),
            client: self.client,
            epoch: self.epoch,
            tier: Tier::BurstBuffer,
            bytes,
            seconds,
        };
        if let Err(error) = self.reporting.service.end_phase(&end) {
            tracing::warn!(%error, "mount phases: reporting a phase's end");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_policy::TierSnapshot;

    /// Records the reports; a begin waits until `gate` opens (a stuck scheduler).
    #[derive(Default)]
    struct Recorder {
        events: std::sync::Mutex<Vec<String>>,
        gate: Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
    }

    impl TierService for Recorder {
        fn begin_phase(&self, begin: &PhaseBegin) -> Result<Tier, String> {
            if let Some(gate) = &self.gate {
                let _ = gate.lock().unwrap().recv();
            }
            assert_eq!(begin.strategy, Some(TieringStrategy::HighPriority));
            self.events.lock().unwrap().push(format!("begin {}", begin.expected_bytes));
            Ok(Tier::BurstBuffer)
        }
        fn end_phase(&self, end: &PhaseEnd) -> Result<(), String> {
            assert_eq!(end.tier, Tier::BurstBuffer);
            self.events.lock().unwrap().push(format!("end {}", end.bytes));
            Ok(())
        }
        fn snapshot(&self) -> Result<TierSnapshot, String> {
            Ok(TierSnapshot::default())
        }
        fn leave(&self, job: &str, _client: u64) -> Result<(), String> {
            self.events.lock().unwrap().push(format!("leave {job}"));
            Ok(())
        }
    }

    fn reporting(recorder: &Arc<Recorder>, quiet: Duration) -> PhaseReporting {
        PhaseReporting { service: recorder.clone(), job: "42".into(), processes: 1, quiet }
    }

    fn wait_for(recorder: &Recorder, events: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while recorder.events.lock().unwrap().len() < events {
            assert!(Instant::now() < deadline, "{:?}", recorder.events.lock().unwrap());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn bursts_of_writes_are_phases_ended_by_quiet_and_the_last_by_unmount() {
        let recorder = Arc::new(Recorder::default());
        // Writes back to back are far closer than 2 s apart; a phase ends 2 s after its last.
        let phases =
            Phases::start(reporting(&recorder, Duration::from_secs(2)), EpochId(9), 7).unwrap();
        for _ in 0..4 {
            phases.wrote(1 << 20);
        }
        wait_for(&recorder, 2);
        phases.wrote(300);
        wait_for(&recorder, 3);
        drop(phases);
        assert_eq!(
            *recorder.events.lock().unwrap(),
            ["begin 0", "end 4194304", "begin 4194304", "end 300", "leave 42"]
        );
    }

    #[test]
    fn a_mount_that_writes_and_unmounts_at_once_still_reports_its_phase() {
        // The reporter thread may not have run once when the mount is dropped: the phase is
        // reported anyway (before, it was lost whenever the drop came first).
        for round in 0..50 {
            let recorder = Arc::new(Recorder::default());
            let phases =
                Phases::start(reporting(&recorder, Duration::from_secs(60)), EpochId(1), 1)
                    .unwrap();
            phases.wrote(512);
            drop(phases);
            assert_eq!(
                *recorder.events.lock().unwrap(),
                ["begin 0", "end 512", "leave 42"],
                "round {round}"
            );
        }
    }

    #[test]
    fn a_stuck_scheduler_never_holds_up_a_write() {
        let (open, gate) = std::sync::mpsc::channel();
        let recorder =
            Arc::new(Recorder { gate: Some(std::sync::Mutex::new(gate)), ..Recorder::default() });
        let phases = Arc::new(
            Phases::start(reporting(&recorder, Duration::from_secs(60)), EpochId(1), 1).unwrap(),
        );
        // The begin report is stuck until the gate opens, which happens only after every
        // write returned: were a write to wait for the scheduler, the writes would never finish.
        let (done, finished) = std::sync::mpsc::channel();
        let writer = phases.clone();
        let writing = std::thread::spawn(move || {
            for _ in 0..1000 {
                writer.wrote(4096);
            }
            done.send(()).unwrap();
        });
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("writes waited for a stuck scheduler");
        writing.join().unwrap();
        assert!(recorder.events.lock().unwrap().is_empty(), "the begin is still stuck");
        open.send(()).unwrap();
        drop(Arc::try_unwrap(phases).ok().expect("the writer thread is done"));
        assert_eq!(*recorder.events.lock().unwrap(), ["begin 0", "end 4096000", "leave 42"]);
    }
}
