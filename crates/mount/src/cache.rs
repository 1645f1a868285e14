//! What the kernel caches of the namespace, and the thread that drops what other users changed
//! (docs/design/mount.md, "Caching and the visibility rule").
//!
//! The kernel keeps entries and attributes for [`crate::MountConfig::attr_ttl`]. The
//! [`Invalidator`] thread long-polls the namespace server for the changes other sessions
//! (mounts, native API users) make, and drops each from the kernel (`inval_entry`,
//! `inval_inode`) before it asks again, which is the server's acknowledgement: a change returns
//! to its maker only once every watching mount has dropped it (or after the server's bound,
//! after which this mount is told to `reset`: it drops everything it handed to the kernel).
//!
//! [`CacheTracker`] remembers what was handed to the kernel with a non-zero TTL, so a reset can
//! drop it all. It is bounded: once full, replies carry TTL 0 (nothing more is cached, so
//! nothing untracked can go stale) until the invalidator has dropped everything and emptied it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use parking_lot::Mutex;
use spillway_namespace::{Change, Ino, Watch};

/// Entries (names) and inodes tracked at most, each; beyond, replies are not cached.
pub const TRACKED_MAX: usize = 262_144;

/// Longest pause between failed polls (the server is unreachable: the TTL bounds staleness).
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Tracked {
    entries: HashSet<(Ino, Vec<u8>)>,
    inodes: HashSet<Ino>,
}

/// What this mount handed to the kernel with a TTL, and a counter of invalidation batches.
#[derive(Default)]
pub struct CacheTracker {
    tracked: Mutex<Tracked>,
    /// Bumped before each batch of invalidations is sent to the kernel: a reply computed while
    /// one ran may hold what it dropped, and is given TTL 0 instead.
    batches: AtomicU64,
    /// Set when the tracker filled up: the invalidator empties it.
    full: AtomicBool,
}

impl CacheTracker {
    /// A mark to pass to [`CacheTracker::entry_ttl`] and [`CacheTracker::attr_ttl`]: take it
    /// before asking the namespace.
    pub fn mark(&self) -> u64 {
        self.batches.load(Ordering::SeqCst)
    }

    /// The TTL for an entry `parent/name` → `ino` asked since `mark`: `ttl`, tracked, or zero
    /// if an invalidation ran meanwhile or the tracker is full.
    pub fn entry_ttl(
        &self,
        mark: u64,
        ttl: Duration,
        parent: Ino,
        name: &[u8],
        ino: Ino,
    ) -> Duration {
        if ttl.is_zero() {
            return ttl;
        }
        let mut tracked = self.tracked.lock();
        if self.batches.load(Ordering::SeqCst) != mark || !self.room(&tracked) {
            return Duration::ZERO;
        }
        tracked.entries.insert((parent, name.to_vec()));
        tracked.inodes.insert(ino);
        ttl
    }

    /// The TTL for attributes of `ino` asked since `mark` (as [`CacheTracker::entry_ttl`]).
    pub fn attr_ttl(&self, mark: u64, ttl: Duration, ino: Ino) -> Duration {
        if ttl.is_zero() {
            return ttl;
        }
        let mut tracked = self.tracked.lock();
        if self.batches.load(Ordering::SeqCst) != mark || !self.room(&tracked) {
            return Duration::ZERO;
        }
        tracked.inodes.insert(ino);
        ttl
    }

    fn room(&self, tracked: &Tracked) -> bool {
        let room = tracked.entries.len() < TRACKED_MAX && tracked.inodes.len() < TRACKED_MAX;
        if !room {
            self.full.store(true, Ordering::SeqCst);
        }
        room
    }

    /// Empties the tracker, returning what it held.
    fn take(&self) -> Tracked {
        let taken = std::mem::take(&mut *self.tracked.lock());
        self.full.store(false, Ordering::SeqCst);
        taken
    }
}

/// Sends the kernel's invalidations for changes other sessions made.
pub struct Invalidator {
    stop: Arc<AtomicBool>,
}

impl Invalidator {
    /// Starts the thread: `watch` has registered already (its first poll returned `since`), so
    /// no change after that is missed.
    pub fn start(
        mut watch: Box<dyn Watch>,
        since: u64,
        tracker: Arc<CacheTracker>,
        notifier: Notifier,
    ) -> std::io::Result<Invalidator> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::Builder::new().name("spillway-invalidate".into()).spawn(move || {
            let mut since = since;
            let mut pause = Duration::from_millis(10);
            loop {
                if stopping.load(Ordering::SeqCst) {
                    watch.end(since);
                    return;
                }
                let changes = match watch.next(since) {
                    Ok(changes) => changes,
                    Err(e) => {
                        // Unreachable server: no invalidation arrives, the TTL bounds what
                        // stays stale; the server resets us if it lost our place.
                        tracing::warn!(error = %e, "polling the namespace's changes failed");
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(RETRY_PAUSE_MAX);
                        continue;
                    }
                };
                pause = Duration::from_millis(10);
                if stopping.load(Ordering::SeqCst) {
                    // Unmounted: nothing to drop any more; acknowledge and leave.
                    watch.end(changes.version);
                    return;
                }
                let gone = if changes.reset {
                    drop_everything(&tracker, &notifier)
                } else {
                    drop_changes(&tracker, &notifier, &changes.changes)
                };
                since = changes.version;
                let full = tracker.full.load(Ordering::SeqCst);
                if gone || (full && drop_everything(&tracker, &notifier)) {
                    tracing::debug!("mount gone: invalidator stops");
                    watch.end(since);
                    return;
                }
            }
        })?;
        Ok(Invalidator { stop })
    }
}

impl Drop for Invalidator {
    /// Stops the thread after its current poll (at most the server's poll bound), when it
    /// ends its subscription; not joined, so unmounting does not wait for it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Whether a notification failed because the mount is gone (stop), not because the kernel had
/// nothing cached (ENOENT, fine).
fn mount_gone(result: std::io::Result<()>) -> bool {
    match result {
        Ok(()) => false,
        Err(e) => matches!(e.raw_os_error(), Some(libc::EBADF | libc::ENODEV | libc::ENOTCONN)),
    }
}

/// Drops `changes` from the kernel. True: the mount is gone.
fn drop_changes(tracker: &CacheTracker, notifier: &Notifier, changes: &[Change]) -> bool {
    if changes.is_empty() {
        return false;
    }
    tracker.batches.fetch_add(1, Ordering::SeqCst);
    for change in changes {
        let result = match change {
            Change::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, 0),
            Change::Entry { parent, name } => {
                tracker.tracked.lock().entries.remove(&(*parent, name.clone()));
                notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
            }
        };
        if mount_gone(result) {
            return true;
        }
    }
    false
}

/// Drops every entry and inode this mount handed to the kernel. True: the mount is gone.
fn drop_everything(tracker: &CacheTracker, notifier: &Notifier) -> bool {
    tracker.batches.fetch_add(1, Ordering::SeqCst);
    let tracked = tracker.take();
    tracing::info!(
        entries = tracked.entries.len(),
        inodes = tracked.inodes.len(),
        "dropping every cached entry and attribute"
    );
    for (parent, name) in &tracked.entries {
        if mount_gone(notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))) {
            return true;
        }
    }
    for ino in &tracked.inodes {
        if mount_gone(notifier.inval_inode(INodeNo(*ino), 0, 0)) {
            return true;
        }
    }
    false
}
