//! Signals: stopping a daemon cleanly on SIGTERM/SIGINT, and signalling other processes.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Sets `stop` when this process receives SIGTERM or SIGINT (the handler only stores to the
/// flag, so the daemon's own loop decides how to wind down).
pub fn stop_on_termination(stop: &Arc<AtomicBool>) -> io::Result<()> {
    for signal in [SIGTERM, SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(stop))?;
    }
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP, caught and queued instead of ending the process, for a process
/// that must clean up (unmount) before it exits.
pub struct StopSignals(signal_hook::iterator::Signals);

impl StopSignals {
    /// Catches the three signals from now on.
    pub fn catch() -> io::Result<StopSignals> {
        Ok(StopSignals(signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?))
    }

    /// The first stop signal that arrives within `timeout`, if any.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(signal) = self.0.pending().next() {
                return Some(signal);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }
}

/// Sends `signal` to process `pid`.
pub fn send(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid} is out of range"))
    })?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_child_gets_the_signal_sent() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        send(child.id(), Signal::SIGTERM).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(send(u32::MAX, Signal::SIGTERM).is_err());
    }

    #[test]
    fn sigterm_sets_the_stop_flag_and_is_queued_for_stop_signals() {
        let stop = Arc::new(AtomicBool::new(false));
        stop_on_termination(&stop).unwrap();
        let mut signals = StopSignals::catch().unwrap();
        assert_eq!(signals.wait(Duration::from_millis(20)), None);
        send(std::process::id(), Signal::SIGTERM).unwrap();
        assert_eq!(signals.wait(Duration::from_secs(10)), Some(SIGTERM));
        assert!(stop.load(Ordering::SeqCst));
    }
}
