//! A child process owned by a benchmark: killed when dropped, so a failed measurement never
//! leaves servers or load generators behind.

use std::process::Child;
use std::time::{Duration, Instant};

/// Dropping it sends SIGTERM (a server then syncs and leaves nothing half-done), waits up to
/// 30 s, then SIGKILLs and reaps.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && self.0.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
