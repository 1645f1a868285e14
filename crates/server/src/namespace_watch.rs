//! Change notification for caching mounts: per namespace, a bounded ring of changes with a
//! version counter, the watchers subscribed to it, and the wait of a change for their
//! acknowledgements (docs/design/mount.md, "Caching and the visibility rule").
//!
//! A watcher (a mount's own connection) long-polls with `NsWatch { session, since }`: the reply
//! carries the changes after `since` that other sessions made; its next poll acknowledges them.
//! A change is answered to its maker only once every other watcher acknowledged it, or after
//! [`WatchOptions::ack_wait`]; a watcher that missed that is stale: nobody waits for it again
//! and its next poll answers `reset` (it drops its whole cache). So when a change returns, every
//! live mount has dropped what it cached of it, and a dead or hostile watcher costs others one
//! bounded wait, once.
//!
//! Watchers are keyed by (uid, session): a session is the mount's random number, also bound to
//! the connections it makes changes on (`NsSession`), so its own changes are neither sent to it
//! nor waited for (its kernel updated itself; waiting would deadlock on the directory lock the
//! kernel holds across the change). A uid can only speak for its own sessions. Nor does a
//! change wait for a session whose earlier change is still waiting (see
//! `NamespaceChanges::must_wait_for`): no cycle of waits.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spillway_namespace::{Change, Changes, NamespaceId};
use spillway_proto::{NamespaceResponse, BODY_BYTES_MAX, CHANGES_BATCH_MAX};

/// Bounds of the change service.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Longest a change waits for the other watchers' acknowledgements.
    pub ack_wait: Duration,
    /// Longest an `NsWatch` waits for a change before answering an empty batch (well below the
    /// connection idle timeout; a poll in progress keeps the connection busy anyway).
    pub poll_wait: Duration,
    /// Changes kept per namespace; a watcher further behind gets `reset`.
    pub ring_max: usize,
    /// Watchers per namespace; more are refused (EBUSY).
    pub watchers_max: usize,
    /// Watchers one non-root uid may have per namespace, stale ones counted until they are
    /// forgotten; more are refused (EUSERS). Root (the mounts) is bounded by `watchers_max`
    /// alone.
    pub watchers_per_user_max: usize,
    /// A watcher that has not polled for this long is forgotten (its mount is gone).
    pub forget_after: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            ack_wait: Duration::from_secs(1),
            poll_wait: Duration::from_secs(5),
            ring_max: 65_536,
            watchers_max: 1024,
            watchers_per_user_max: 16,
            forget_after: Duration::from_secs(60),
        }
    }
}

/// Who a watcher (or a change's maker) is: the peer's uid and the session it chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub uid: u32,
    pub session: u64,
}

struct Recorded {
    version: u64,
    origin: Option<SessionKey>,
    change: Change,
}

struct Watcher {
    /// Every change up to this version is out of its cache.
    acked: u64,
    /// Missed an acknowledgement deadline: not waited for; its next poll answers `reset`.
    stale: bool,
    /// Reset after it went stale: not waited for until it acknowledges a version after this
    /// one (its reset's), so a watcher that takes changes and never acknowledges them costs
    /// others one wait, not one per change.
    probation: Option<u64>,
    /// Root watchers (the mount) get names; others get the parent directory's inode instead.
    names: bool,
    last_poll: Instant,
}

impl Watcher {
    /// Answers `reset` at `version`: everything up to it is out of its cache. One that went
    /// stale stays on probation.
    fn reset(&mut self, version: u64) {
        if self.stale {
            self.probation = Some(version);
        }
        self.stale = false;
        self.acked = version;
    }
}

#[derive(Default)]
struct NamespaceChanges {
    version: u64,
    ring: VecDeque<Recorded>,
    watchers: HashMap<SessionKey, Watcher>,
    /// The versions of each session's changes waiting for acknowledgements right now.
    in_flight: HashMap<SessionKey, Vec<u64>>,
}

impl NamespaceChanges {
    /// Whether watcher `key` must acknowledge `version` before it returns. Not the maker's own,
    /// not a stale one, and not one whose session has an earlier change still waiting: its
    /// kernel may hold a directory lock for that change that its invalidator needs to drop
    /// ours, while that change waits for us (two mounts removing names in one directory).
    /// Only the later of two such changes returns without the other's acknowledgement, so no
    /// cycle of waits forms.
    fn must_wait_for(
        &self,
        key: &SessionKey,
        watcher: &Watcher,
        origin: Option<SessionKey>,
        version: u64,
    ) -> bool {
        let earlier_in_flight =
            self.in_flight.get(key).is_some_and(|versions| versions.iter().any(|&v| v < version));
        Some(*key) != origin
            && !watcher.stale
            && watcher.probation.is_none()
            && watcher.acked < version
            && !earlier_in_flight
    }

    /// The oldest version a watcher may have acknowledged and still get every later change.
    fn oldest_complete(&self) -> u64 {
        self.ring.front().map_or(self.version, |first| first.version - 1)
    }
}

/// Why a watcher is refused.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("namespace {namespace} has its maximum of {max} watchers")]
    TooManyWatchers { namespace: NamespaceId, max: usize },
    #[error(
        "uid {uid} has its maximum of {max} watch sessions of namespace {namespace} \
         (server.namespace_watchers_per_user_max; a session not polled is counted until it is forgotten)"
    )]
    TooManyWatchersOfUser { namespace: NamespaceId, uid: u32, max: usize },
}

impl WatchError {
    /// The errno the client gets: EBUSY when the namespace is full, EUSERS when the uid is.
    pub fn errno(&self) -> i32 {
        match self {
            WatchError::TooManyWatchers { .. } => libc::EBUSY,
            WatchError::TooManyWatchersOfUser { .. } => libc::EUSERS,
        }
    }
}

/// Every namespace's changes and watchers.
pub struct Watches {
    options: WatchOptions,
    state: Mutex<HashMap<NamespaceId, NamespaceChanges>>,
    /// Signalled when a change is recorded (pollers wake) and when a watcher polls (changes
    /// waiting for acknowledgements re-check).
    signal: Condvar,
}

impl Watches {
    pub fn new(options: WatchOptions) -> Watches {
        Watches { options, state: Mutex::new(HashMap::new()), signal: Condvar::new() }
    }

    /// Forgets a removed namespace's changes and watchers (their polls get ENOENT/ESTALE next).
    pub fn forget(&self, namespace: NamespaceId) {
        self.state.lock().remove(&namespace);
        self.signal.notify_all();
    }

    /// Records `changes` made by `origin` to `namespace` for the watchers and returns without
    /// waiting for their acknowledgements: for a name added to a directory (create, mkdir,
    /// symlink), which no mount can have cached (names found absent are never cached), so only
    /// the directory's attributes on other mounts lag until the invalidation lands.
    pub fn announce(
        &self,
        namespace: NamespaceId,
        origin: Option<SessionKey>,
        changes: Vec<Change>,
    ) {
        let mut state = self.state.lock();
        if self.record(&mut state, namespace, origin, changes, Instant::now()).is_some() {
            self.signal.notify_all();
        }
    }

    /// Appends `changes` to the namespace's ring (after forgetting silent watchers); the last
    /// version, or `None` when nobody but `origin` watches (nothing recorded).
    fn record(
        &self,
        state: &mut HashMap<NamespaceId, NamespaceChanges>,
        namespace: NamespaceId,
        origin: Option<SessionKey>,
        changes: Vec<Change>,
        now: Instant,
    ) -> Option<u64> {
        if changes.is_empty() {
            return None;
        }
        let entry = state.get_mut(&namespace)?;
        let forget_after = self.options.forget_after;
        entry.watchers.retain(|_, w| now.duration_since(w.last_poll) < forget_after);
        if entry.watchers.keys().all(|key| Some(*key) == origin) {
            return None;
        }
        for change in changes {
            entry.version += 1;
            let version = entry.version;
            entry.ring.push_back(Recorded { version, origin, change });
        }
        while entry.ring.len() > self.options.ring_max {
            entry.ring.pop_front();
        }
        Some(entry.version)
    }

    /// Records `changes` made by `origin` to `namespace` and waits until every other live
    /// watcher acknowledged them (or the bound passed: those are stale then). Returns at once
    /// when nobody else watches.
    pub fn publish(
        &self,
        namespace: NamespaceId,
        origin: Option<SessionKey>,
        changes: Vec<Change>,
    ) {
        let mut state = self.state.lock();
        let now = Instant::now();
        let Some(version) = self.record(&mut state, namespace, origin, changes, now) else {
            return;
        };
        let Some(entry) = state.get_mut(&namespace) else { return };
        if let Some(origin) = origin {
            entry.in_flight.entry(origin).or_default().push(version);
        }
        self.signal.notify_all();
        let deadline = now + self.options.ack_wait;
        loop {
            let Some(entry) = state.get_mut(&namespace) else { return };
            let lagging: Vec<SessionKey> = entry
                .watchers
                .iter()
                .filter(|(key, w)| entry.must_wait_for(key, w, origin, version))
                .map(|(key, _)| *key)
                .collect();
            let expired = Instant::now() >= deadline;
            if lagging.is_empty() || expired {
                for key in &lagging {
                    tracing::warn!(
                        namespace,
                        uid = key.uid,
                        session = key.session,
                        version,
                        "namespace watcher did not acknowledge a change in time: stale until it polls again"
                    );
                    if let Some(watcher) = entry.watchers.get_mut(key) {
                        watcher.stale = true;
                    }
                }
                if let Some(origin) = origin {
                    if let Some(versions) = entry.in_flight.get_mut(&origin) {
                        versions.retain(|&v| v != version);
                        if versions.is_empty() {
                            entry.in_flight.remove(&origin);
                        }
                    }
                }
                // Later changes that skipped our session wait for it again.
                self.signal.notify_all();
                return;
            }
            self.signal.wait_until(&mut state, deadline);
        }
    }

    /// One poll of watcher `key` of `namespace`, acknowledging `since`: the changes after it
    /// (waiting up to the poll bound for some), or `reset`.
    pub fn poll(
        &self,
        namespace: NamespaceId,
        key: SessionKey,
        names: bool,
        since: u64,
    ) -> Result<Changes, WatchError> {
        let mut state = self.state.lock();
        let now = Instant::now();
        if since == spillway_namespace::WATCH_END {
            // The watcher leaves (its mount unmounts): no change waits for it any more.
            let version = state.get_mut(&namespace).map_or(0, |entry| {
                entry.watchers.remove(&key);
                entry.version
            });
            self.signal.notify_all();
            return Ok(Changes { version, reset: false, changes: Vec::new() });
        }
        let entry = state.entry(namespace).or_default();
        let oldest_complete = entry.oldest_complete();
        let Some(watcher) = entry.watchers.get_mut(&key) else {
            self.admit(entry, namespace, key.uid, now)?;
            // New (or forgotten, or this server restarted): it knows nothing of our versions.
            // A watcher that had some must drop its cache; a new one has none.
            let version = entry.version;
            entry.watchers.insert(
                key,
                Watcher { acked: version, stale: false, probation: None, names, last_poll: now },
            );
            return Ok(Changes { version, reset: since != 0, changes: Vec::new() });
        };
        watcher.last_poll = now;
        watcher.names = names;
        let version = entry.version;
        if watcher.stale || since > version || since < oldest_complete {
            watcher.reset(version);
            self.signal.notify_all();
            return Ok(Changes { version, reset: true, changes: Vec::new() });
        }
        watcher.acked = watcher.acked.max(since);
        if watcher.probation.is_some_and(|reset_at| since > reset_at) {
            watcher.probation = None;
        }
        self.signal.notify_all();
        let deadline = now + self.options.poll_wait;
        loop {
            let Some(entry) = state.get_mut(&namespace) else {
                return Ok(Changes { version: 0, reset: true, changes: Vec::new() });
            };
            let oldest_complete = entry.oldest_complete();
            let Some(watcher) = entry.watchers.get_mut(&key) else {
                return Ok(Changes { version: entry.version, reset: true, changes: Vec::new() });
            };
            watcher.last_poll = Instant::now();
            if watcher.stale || since < oldest_complete {
                watcher.reset(entry.version);
                return Ok(Changes { version: entry.version, reset: true, changes: Vec::new() });
            }
            if entry.version > since {
                return Ok(batch(entry, key, names, since));
            }
            if Instant::now() >= deadline {
                return Ok(Changes { version: since, reset: false, changes: Vec::new() });
            }
            self.signal.wait_until(&mut state, deadline);
        }
    }
}

impl Watches {
    /// Whether a new watcher of `uid` fits `entry` (after forgetting the silent ones): the
    /// namespace's bound, and a non-root uid's own, which counts its stale watchers too (each
    /// cost a change one wait; a uid opening sessions it never polls again would otherwise make
    /// every change wait, and fill the namespace's places).
    fn admit(
        &self,
        entry: &mut NamespaceChanges,
        namespace: NamespaceId,
        uid: u32,
        now: Instant,
    ) -> Result<(), WatchError> {
        let forget_after = self.options.forget_after;
        entry.watchers.retain(|_, w| now.duration_since(w.last_poll) < forget_after);
        let max = self.options.watchers_per_user_max;
        if uid != 0 && entry.watchers.keys().filter(|k| k.uid == uid).count() >= max {
            return Err(WatchError::TooManyWatchersOfUser { namespace, uid, max });
        }
        if entry.watchers.len() >= self.options.watchers_max {
            return Err(WatchError::TooManyWatchers { namespace, max: self.options.watchers_max });
        }
        Ok(())
    }
}

/// The changes after `since` not made by `key`, as many as fit one reply; `version` is the last
/// one looked at (the watcher's next `since`).
fn batch(entry: &NamespaceChanges, key: SessionKey, names: bool, since: u64) -> Changes {
    // version u64, reset u8, count u32.
    let mut bytes = 13usize;
    let mut changes = Vec::new();
    let mut version = since;
    let start = entry.ring.partition_point(|r| r.version <= since);
    for recorded in entry.ring.range(start..) {
        if recorded.origin != Some(key) {
            let change = match &recorded.change {
                // Names are for root watchers (the mount, trusted like an NFS client); others
                // learn which directory changed, not what it holds.
                Change::Entry { parent, .. } if !names => Change::Inode(*parent),
                other => other.clone(),
            };
            let size = NamespaceResponse::change_bytes(&change);
            if changes.len() == CHANGES_BATCH_MAX || bytes + size > BODY_BYTES_MAX as usize {
                break;
            }
            bytes += size;
            changes.push(change);
        }
        version = recorded.version;
    }
    Changes { version, reset: false, changes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: u64) -> SessionKey {
        SessionKey { uid: 0, session }
    }

    fn quick() -> WatchOptions {
        WatchOptions {
            ack_wait: Duration::from_millis(200),
            poll_wait: Duration::from_millis(50),
            ring_max: 4,
            ..WatchOptions::default()
        }
    }

    #[test]
    fn a_watcher_gets_others_changes_not_its_own_and_a_laggard_becomes_stale() {
        let watches = Watches::new(quick());
        let first = watches.poll(1, key(1), true, 0).unwrap();
        assert_eq!(first, Changes { version: 0, reset: false, changes: vec![] });
        // Its own change: not waited for, not delivered.
        watches.publish(1, Some(key(1)), vec![Change::Inode(5)]);
        let own = watches.poll(1, key(1), true, 0).unwrap();
        assert!(own.changes.is_empty() && !own.reset);
        // Another session's change: delivered; the publisher waited (the watcher never acked
        // within the bound), so the watcher is stale and its next poll resets.
        watches.publish(1, Some(key(2)), vec![Change::Entry { parent: 1, name: b"a".to_vec() }]);
        let next = watches.poll(1, key(1), true, 0).unwrap();
        assert!(next.reset, "{next:?}");
        // A watcher that is not root gets the directory, not the name.
        let registered = watches.poll(1, key(3), false, 0).unwrap().version;
        let got = std::thread::scope(|scope| {
            let publisher = scope.spawn(|| {
                watches.publish(1, None, vec![Change::Entry { parent: 9, name: b"x".to_vec() }])
            });
            let got = watches.poll(1, key(3), false, registered).unwrap();
            // Acknowledges; the publisher returns (key 1 never polls: stale after the bound).
            watches.poll(1, key(3), false, got.version).unwrap();
            publisher.join().unwrap();
            got
        });
        assert_eq!(got.changes, vec![Change::Inode(9)]);
    }

    #[test]
    fn a_watcher_that_never_acknowledges_costs_one_wait_not_one_per_change() {
        let watches = Watches::new(quick());
        let registered = watches.poll(6, key(1), true, 0).unwrap().version;
        let waited_for = |watches: &Watches| {
            let state = watches.state.lock();
            let entry = &state[&6];
            entry.must_wait_for(&key(1), &entry.watchers[&key(1)], Some(key(2)), entry.version + 1)
        };
        assert!(waited_for(&watches));
        // The first change waits its bound for the silent watcher, which goes stale.
        watches.publish(6, Some(key(2)), vec![Change::Inode(1)]);
        assert!(!waited_for(&watches));
        // It polls again (reset) and takes the next change without acknowledging it: still
        // not waited for, however often it does that.
        let reset = watches.poll(6, key(1), true, registered).unwrap();
        assert!(reset.reset);
        assert!(!waited_for(&watches), "a watcher back from stale is waited for at once");
        watches.publish(6, Some(key(2)), vec![Change::Inode(2)]);
        let got = watches.poll(6, key(1), true, reset.version).unwrap();
        assert_eq!(got.changes, vec![Change::Inode(2)]);
        assert!(!waited_for(&watches));
        // Acknowledging a change after its reset makes it a watcher like any other again.
        watches.poll(6, key(1), true, got.version).unwrap();
        assert!(waited_for(&watches));
    }

    #[test]
    fn two_sessions_changing_at_once_do_not_wait_for_each_other_in_a_cycle() {
        // An hour's bound: only the rule against cycles lets this test end.
        let watches = Watches::new(WatchOptions { ack_wait: Duration::from_secs(3600), ..quick() });
        let first = watches.poll(4, key(1), true, 0).unwrap().version;
        watches.poll(4, key(2), true, 0).unwrap();
        std::thread::scope(|scope| {
            // Session 1's change waits for session 2's watcher...
            let earlier = scope.spawn(|| watches.publish(4, Some(key(1)), vec![Change::Inode(1)]));
            while watches.state.lock()[&4].in_flight.is_empty() {
                std::thread::yield_now();
            }
            // ...whose session changes meanwhile, as if its kernel held the lock session 2's
            // invalidator needs: the later change does not wait for session 1's watcher.
            watches.publish(4, Some(key(2)), vec![Change::Inode(2)]);
            // Now session 2's watcher acknowledges the earlier change, which returns.
            let got = watches.poll(4, key(2), true, first).unwrap();
            assert_eq!(got.changes, vec![Change::Inode(1)]);
            watches.poll(4, key(2), true, got.version).unwrap();
            earlier.join().unwrap();
        });
        assert!(!watches.state.lock()[&4].watchers.values().any(|w| w.stale));
    }

    #[test]
    fn an_added_name_is_announced_without_waiting_and_still_delivered() {
        // An hour's bound: `announce` must not wait at all for the watcher that never acks.
        let watches = Watches::new(WatchOptions { ack_wait: Duration::from_secs(3600), ..quick() });
        let registered = watches.poll(5, key(1), true, 0).unwrap().version;
        watches.announce(5, Some(key(2)), vec![Change::Inode(1)]);
        let got = watches.poll(5, key(1), true, registered).unwrap();
        assert_eq!(got.changes, vec![Change::Inode(1)]);
        assert!(!got.reset, "nobody waited for it, so it is not stale");
    }

    #[test]
    fn a_watcher_that_left_is_not_waited_for() {
        let watches = Watches::new(WatchOptions { ack_wait: Duration::from_secs(3600), ..quick() });
        watches.poll(3, key(1), true, 0).unwrap();
        watches.poll(3, key(1), true, spillway_namespace::WATCH_END).unwrap();
        assert!(!watches.state.lock()[&3].watchers.contains_key(&key(1)));
        // Nobody else watches: returns at once (it would wait an hour for a watcher left behind).
        watches.publish(3, Some(key(2)), vec![Change::Inode(1)]);
        assert_eq!(watches.state.lock()[&3].version, 0, "nothing recorded for nobody");
    }

    fn user(uid: u32, session: u64) -> SessionKey {
        SessionKey { uid, session }
    }

    #[test]
    fn a_non_root_uid_is_refused_beyond_its_bound_and_root_and_other_uids_are_not() {
        let watches = Watches::new(WatchOptions { watchers_per_user_max: 2, ..quick() });
        watches.poll(6, user(1000, 1), false, 0).unwrap();
        watches.poll(6, user(1000, 2), false, 0).unwrap();
        let refused = watches.poll(6, user(1000, 3), false, 0).unwrap_err();
        assert!(
            matches!(
                refused,
                WatchError::TooManyWatchersOfUser { namespace: 6, uid: 1000, max: 2 }
            ),
            "{refused:?}"
        );
        assert_eq!(refused.errno(), libc::EUSERS);
        let said = refused.to_string();
        assert!(said.contains("uid 1000") && said.contains("maximum of 2"), "{said}");
        // Its own sessions keep polling; another uid and root are not held by its bound.
        let version = watches.poll(6, user(1000, 1), false, 0).unwrap().version;
        watches.poll(6, user(1000, 2), false, version).unwrap();
        watches.poll(6, user(1001, 1), false, 0).unwrap();
        for session in 1..=5 {
            watches.poll(6, key(session), true, 0).unwrap();
        }
        // Another namespace has its own count.
        watches.poll(7, user(1000, 3), false, 0).unwrap();
        // Root is bounded by the namespace's maximum only (EBUSY).
        let full = Watches::new(WatchOptions { watchers_max: 3, ..quick() });
        for session in 1..=3 {
            full.poll(8, key(session), true, 0).unwrap();
        }
        let refused = full.poll(8, key(4), true, 0).unwrap_err();
        assert!(matches!(refused, WatchError::TooManyWatchers { namespace: 8, max: 3 }));
        assert_eq!(refused.errno(), libc::EBUSY);
    }

    #[test]
    fn a_uids_stale_watchers_count_against_its_bound_until_forgotten() {
        // Nobody acknowledges in time (ack_wait 0): the uid's silent sessions are stale.
        let options = WatchOptions {
            ack_wait: Duration::ZERO,
            watchers_per_user_max: 2,
            forget_after: Duration::from_secs(3600),
            ..quick()
        };
        let watches = Watches::new(options.clone());
        watches.poll(9, user(1000, 1), false, 0).unwrap();
        watches.poll(9, user(1000, 2), false, 0).unwrap();
        watches.publish(9, None, vec![Change::Inode(1)]);
        assert!(watches.state.lock()[&9].watchers.values().all(|w| w.stale));
        let refused = watches.poll(9, user(1000, 3), false, 0).unwrap_err();
        assert!(matches!(refused, WatchError::TooManyWatchersOfUser { uid: 1000, .. }));
        // Forgotten (silent longer than `forget_after`, here at once): the places are free,
        // also without a change recording anything.
        let forgetful = Watches::new(WatchOptions { forget_after: Duration::ZERO, ..options });
        forgetful.poll(9, user(1000, 1), false, 0).unwrap();
        forgetful.poll(9, user(1000, 2), false, 0).unwrap();
        forgetful.poll(9, user(1000, 3), false, 0).unwrap();
        let kept: Vec<SessionKey> = forgetful.state.lock()[&9].watchers.keys().copied().collect();
        assert_eq!(kept, vec![user(1000, 3)], "the silent ones were forgotten");
    }

    #[test]
    fn a_watcher_behind_the_ring_is_reset() {
        let watches = Watches::new(WatchOptions { ack_wait: Duration::ZERO, ..quick() });
        watches.poll(2, key(1), true, 0).unwrap();
        for ino in 0..10 {
            watches.publish(2, None, vec![Change::Inode(ino)]);
        }
        // Stale already (ack_wait 0); and far behind the ring of 4.
        assert!(watches.poll(2, key(1), true, 1).unwrap().reset);
    }
}
