//! Which API connections the manager serves now, and how it turns the others away.
//!
//! At most `manager.connections_max` connections are served at once, and at most
//! `manager.connections_per_uid_max` of them for one uid other than root (root is the Slurm
//! hooks and the operator, bound only by the total), so one user holding many connections
//! cannot starve everyone else. A connection over either limit gets `503 Service Unavailable`
//! with `Retry-After` ([`BUSY_RETRY_AFTER_S`]) and a body naming the limit; the API client
//! retries such answers. The refusal is a lingering close ([`reply_and_linger`]): the reply is
//! sent, the sending side shut, and what the client still sends is read and dropped until it
//! closes or [`REFUSED_LINGER`] passes, so the client reads the 503 instead of a reset (closing
//! a socket with unread bytes resets the connection). Refusals run on their own short-lived
//! threads, at most `connections_max` at once; beyond that a connection is closed at once.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_proto::Connection;

/// What a busy manager asks a client to wait before retrying (`Retry-After`, seconds).
pub const BUSY_RETRY_AFTER_S: u64 = 1;

/// How long a refused connection stays open after its reply for the client to finish sending
/// and read the reply.
pub const REFUSED_LINGER: Duration = Duration::from_millis(500);

/// Why a connection is not served now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error("{max} API connections in use (knob manager.connections_max); retry")]
    AllInUse { max: usize },
    #[error("uid {uid} already holds {max} API connections (knob manager.connections_per_uid_max); retry")]
    UidLimit { uid: u32, max: usize },
}

/// The connections being served, in total and per uid.
pub struct ConnectionSlots {
    total_max: usize,
    per_uid_max: usize,
    counts: Mutex<SlotCounts>,
}

#[derive(Default)]
struct SlotCounts {
    total: usize,
    per_uid: BTreeMap<u32, usize>,
}

/// One connection being served; its slot is given back when dropped.
pub struct Slot {
    slots: Arc<ConnectionSlots>,
    uid: u32,
}

impl ConnectionSlots {
    pub fn new(total_max: usize, per_uid_max: usize) -> Arc<ConnectionSlots> {
        Arc::new(ConnectionSlots { total_max, per_uid_max, counts: Mutex::default() })
    }

    /// A slot for a connection of `uid`, unless that would pass a limit.
    pub fn try_take(self: &Arc<Self>, uid: u32) -> Result<Slot, Busy> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.total >= self.total_max {
            return Err(Busy::AllInUse { max: self.total_max });
        }
        let mine = counts.per_uid.get(&uid).copied().unwrap_or(0);
        if uid != 0 && mine >= self.per_uid_max {
            return Err(Busy::UidLimit { uid, max: self.per_uid_max });
        }
        counts.total += 1;
        counts.per_uid.insert(uid, mine + 1);
        Ok(Slot { slots: Arc::clone(self), uid })
    }

    /// Connections being served now.
    pub fn in_use(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total -= 1;
        match counts.per_uid.get_mut(&self.uid) {
            Some(1) | None => {
                counts.per_uid.remove(&self.uid);
            }
            Some(n) => *n -= 1,
        }
    }
}

/// Turns connections away on short-lived threads, at most `max` at once.
pub struct Refuser {
    max: usize,
    refusing: Arc<AtomicUsize>,
}

impl Refuser {
    pub fn new(max: usize) -> Refuser {
        Refuser { max, refusing: Arc::new(AtomicUsize::new(0)) }
    }

    /// Sends `head` and `body` and closes lingering ([`reply_and_linger`]) on its own thread;
    /// closes at once when `max` refusals are already lingering.
    pub fn refuse(&self, connection: Box<dyn Connection>, head: String, body: Vec<u8>) {
        if self.refusing.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.refusing.fetch_sub(1, Ordering::AcqRel);
            connection.shutdown();
            return;
        }
        let refusing = Arc::clone(&self.refusing);
        let spawned = std::thread::Builder::new().name("manager-refuse".into()).spawn(move || {
            reply_and_linger(connection, head.as_bytes(), &body);
            refusing.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(error) = spawned {
            self.refusing.fetch_sub(1, Ordering::AcqRel);
            tracing::error!(%error, "cannot start a thread to refuse an API connection");
        }
    }
}

/// Sends a reply, shuts the sending side, then reads and drops what the client still sends
/// until it closes or [`REFUSED_LINGER`] passes: a lingering close, so the client reads the
/// reply rather than a connection reset even if it had not finished sending its request.
pub fn reply_and_linger(mut connection: Box<dyn Connection>, head: &[u8], body: &[u8]) {
    let deadline = Instant::now() + REFUSED_LINGER;
    let _ = connection.set_write_timeout(Some(REFUSED_LINGER));
    let sent = connection
        .write_all(head)
        .and_then(|()| connection.write_all(body))
        .and_then(|()| connection.flush());
    if sent.is_err() {
        return;
    }
    connection.shutdown_write();
    let mut sink = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || connection.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match connection.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_the_total_and_each_uid_but_root() {
        let slots = ConnectionSlots::new(5, 2);
        let a1 = slots.try_take(1000).unwrap();
        let _a2 = slots.try_take(1000).unwrap();
        assert_eq!(slots.try_take(1000).err(), Some(Busy::UidLimit { uid: 1000, max: 2 }));
        let _b = slots.try_take(1001).unwrap();
        let _root: Vec<Slot> = (0..2).map(|_| slots.try_take(0).unwrap()).collect();
        assert_eq!(slots.in_use(), 5);
        assert_eq!(slots.try_take(0).err(), Some(Busy::AllInUse { max: 5 }));
        drop(a1);
        assert_eq!(slots.in_use(), 4);
        let _a3 = slots.try_take(1000).expect("a slot given back is free again");
        assert!(Busy::UidLimit { uid: 7, max: 2 }
            .to_string()
            .contains("knob manager.connections_per_uid_max"));
    }
}
