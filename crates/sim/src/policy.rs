//! Eviction policies of the simulated burst buffer: pure bookkeeping over dense slot numbers, no
//! clock and no I/O, so the same code can later serve the daemon's cache.
//!
//! They live here rather than in crates/policy because that crate is being built by another
//! engineer at the same time; moving them there is a rename, since nothing in this module knows
//! about the simulator. Each policy answers four events — a slot became resident, was hit, was
//! removed — and names its next victim. All operations are O(1) except LFU's (O(log n)).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Which eviction policy to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Least recently used (Xu/Sato's evaluation policy).
    Lru,
    /// First in, first out: hits do not refresh a chunk.
    Fifo,
    /// Least frequently used, ties broken by least recently used.
    Lfu,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Lru, PolicyKind::Fifo, PolicyKind::Lfu];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::Lfu => "lfu",
        }
    }

    pub fn parse(text: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.iter().copied().find(|kind| kind.name().eq_ignore_ascii_case(text))
    }
}

/// The events an eviction policy sees. Slots are dense indices below the cache's slot count.
pub trait EvictionPolicy {
    /// `slot` became resident.
    fn insert(&mut self, slot: u32);
    /// `slot` was accessed while resident.
    fn touch(&mut self, slot: u32);
    /// `slot` left the cache (evicted or its file was removed).
    fn remove(&mut self, slot: u32);
    /// The slot to evict next, if any slot is resident.
    fn victim(&self) -> Option<u32>;
}

const NONE: u32 = u32::MAX;

/// Intrusive doubly-linked list over slots; head is the most recently inserted or touched.
#[derive(Debug, Default)]
struct SlotList {
    previous: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl SlotList {
    fn new() -> Self {
        SlotList { head: NONE, tail: NONE, ..SlotList::default() }
    }

    fn grow_to(&mut self, slot: u32) {
        let needed = slot as usize + 1;
        if self.linked.len() < needed {
            self.previous.resize(needed, NONE);
            self.next.resize(needed, NONE);
            self.linked.resize(needed, false);
        }
    }

    fn push_front(&mut self, slot: u32) {
        self.grow_to(slot);
        assert!(!self.linked[slot as usize], "slot {slot} inserted twice");
        let index = slot as usize;
        self.previous[index] = NONE;
        self.next[index] = self.head;
        if self.head != NONE {
            self.previous[self.head as usize] = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
        self.linked[index] = true;
        self.len += 1;
    }

    fn unlink(&mut self, slot: u32) {
        let index = slot as usize;
        assert!(self.linked.get(index).copied().unwrap_or(false), "slot {slot} is not resident");
        let (previous, next) = (self.previous[index], self.next[index]);
        if previous != NONE {
            self.next[previous as usize] = next;
        } else {
            self.head = next;
        }
        if next != NONE {
            self.previous[next as usize] = previous;
        } else {
            self.tail = previous;
        }
        self.linked[index] = false;
        self.len -= 1;
    }

    fn back(&self) -> Option<u32> {
        (self.tail != NONE).then_some(self.tail)
    }
}

/// Least recently used.
#[derive(Debug)]
pub struct Lru {
    list: SlotList,
}

impl Default for Lru {
    fn default() -> Self {
        Lru { list: SlotList::new() }
    }
}

impl EvictionPolicy for Lru {
    fn insert(&mut self, slot: u32) {
        self.list.push_front(slot);
    }

    fn touch(&mut self, slot: u32) {
        if self.list.head != slot {
            self.list.unlink(slot);
            self.list.push_front(slot);
        }
    }

    fn remove(&mut self, slot: u32) {
        self.list.unlink(slot);
    }

    fn victim(&self) -> Option<u32> {
        self.list.back()
    }
}

/// First in, first out.
#[derive(Debug)]
pub struct Fifo {
    list: SlotList,
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo { list: SlotList::new() }
    }
}

impl EvictionPolicy for Fifo {
    fn insert(&mut self, slot: u32) {
        self.list.push_front(slot);
    }

    fn touch(&mut self, slot: u32) {
        debug_assert!(self.list.linked[slot as usize]);
    }

    fn remove(&mut self, slot: u32) {
        self.list.unlink(slot);
    }

    fn victim(&self) -> Option<u32> {
        self.list.back()
    }
}

/// Least frequently used; among equal counts the least recently used goes first. Counts start
/// at 1 on insertion and are forgotten on eviction (no ghost history).
#[derive(Debug, Default)]
pub struct Lfu {
    order: BTreeSet<(u64, u64, u32)>,
    key_of_slot: Vec<Option<(u64, u64)>>,
    clock: u64,
}

impl Lfu {
    fn key_mut(&mut self, slot: u32) -> &mut Option<(u64, u64)> {
        let index = slot as usize;
        if self.key_of_slot.len() <= index {
            self.key_of_slot.resize(index + 1, None);
        }
        &mut self.key_of_slot[index]
    }
}

impl EvictionPolicy for Lfu {
    fn insert(&mut self, slot: u32) {
        self.clock += 1;
        let key = (1, self.clock);
        let entry = self.key_mut(slot);
        assert!(entry.is_none(), "slot {slot} inserted twice");
        *entry = Some(key);
        self.order.insert((key.0, key.1, slot));
    }

    fn touch(&mut self, slot: u32) {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.key_mut(slot);
        let (count, stamp) = entry.expect("touched slot is resident");
        *entry = Some((count + 1, clock));
        let removed = self.order.remove(&(count, stamp, slot));
        assert!(removed);
        self.order.insert((count + 1, clock, slot));
    }

    fn remove(&mut self, slot: u32) {
        let (count, stamp) = self.key_mut(slot).take().expect("removed slot is resident");
        let removed = self.order.remove(&(count, stamp, slot));
        assert!(removed);
    }

    fn victim(&self) -> Option<u32> {
        self.order.first().map(|&(_, _, slot)| slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain<P: EvictionPolicy>(policy: &mut P) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(slot) = policy.victim() {
            policy.remove(slot);
            out.push(slot);
        }
        out
    }

    #[test]
    fn lru_evicts_least_recently_used() {
        let mut lru = Lru::default();
        for slot in 0..4 {
            lru.insert(slot);
        }
        lru.touch(0);
        lru.touch(2);
        assert_eq!(drain(&mut lru), vec![1, 3, 0, 2]);
    }

    #[test]
    fn fifo_ignores_hits() {
        let mut fifo = Fifo::default();
        for slot in 0..4 {
            fifo.insert(slot);
        }
        fifo.touch(0);
        assert_eq!(drain(&mut fifo), vec![0, 1, 2, 3]);
    }

    #[test]
    fn lfu_evicts_least_frequent_then_oldest() {
        let mut lfu = Lfu::default();
        for slot in 0..4 {
            lfu.insert(slot);
        }
        lfu.touch(0);
        lfu.touch(0);
        lfu.touch(3);
        assert_eq!(drain(&mut lfu), vec![1, 2, 3, 0]);
    }

    #[test]
    fn removal_from_the_middle_keeps_order() {
        let mut lru = Lru::default();
        for slot in 0..5 {
            lru.insert(slot);
        }
        lru.remove(2);
        lru.insert(2);
        assert_eq!(drain(&mut lru), vec![0, 1, 3, 4, 2]);
    }

    #[test]
    #[should_panic(expected = "inserted twice")]
    fn double_insert_is_a_bug() {
        let mut lru = Lru::default();
        lru.insert(1);
        lru.insert(1);
    }

    #[test]
    fn policy_names_parse_back() {
        for kind in PolicyKind::ALL {
            assert_eq!(PolicyKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(PolicyKind::parse("arc"), None);
    }
}
