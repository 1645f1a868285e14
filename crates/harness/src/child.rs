//! A child process that is stopped when its owner is done with it.

use std::process::Child;
use std::time::{Duration, Instant};

use spillway_sys::signal::{send, Signal};

/// How long a dropped child gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(30);

/// Owns a child: dropping it sends SIGTERM (so a server syncs and leaves nothing half-done),
/// waits up to 30 s, then SIGKILLs and reaps it. A failed measurement or step never leaves a
/// server or load generator behind.
#[derive(Debug)]
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_some() {
            return;
        }
        // Not reaped yet (try_wait above), so the pid is still our child's.
        let _ = send(self.0.id(), Signal::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline && self.0.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_dropped_child_gets_sigterm_and_is_reaped() {
        let child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        drop(Reaped(child));
        // Reaped, not a zombie: the pid is gone from /proc.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        send(child.id(), Signal::SIGTERM).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }
}
