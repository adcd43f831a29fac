//! The front-end cache (AsymNVM §4.4, §8.3).
//!
//! Objects (nodes) are cached whole, keyed by their remote address, and
//! always hold the front-end's latest view (writes update them in place).
//! Replacement is the paper's hybrid of LRU and random replacement, made
//! level-aware (AsymNVM §5: the upper levels of a tree stay cached): a
//! random sample of [`SAMPLE`] entries is drawn and, of the deepest level
//! in it, the least recently used is evicted, so leaves go before the
//! inner nodes that route to them. Admission is level-aware: an object of depth `d` (0 = root)
//! is cached only while `d <= limit`, and the limit adapts to the miss ratio
//! of each window of lookups (above 50%: one level fewer; below 25%: one
//! more), so the hot upper levels of a tree stay cached.

use std::collections::BTreeMap;

use rand::rngs::StdRng as SmallRng;
use rand::{Rng, SeedableRng};

/// Entries sampled per eviction.
pub const SAMPLE: usize = 32;
/// Lookups per adaptation window.
const WINDOW: u64 = 512;

struct Entry {
    data: Vec<u8>,
    /// Index of the entry's slot.
    slot: usize,
}

/// What eviction ranks an entry by, kept in one array so a sample reads
/// no tree nodes: its address, level and last use.
#[derive(Clone, Copy)]
struct Slot {
    addr: u64,
    depth: u32,
    last: u64,
}

/// A byte-bounded object cache.
pub struct Cache {
    cap: usize,
    used: usize,
    map: BTreeMap<u64, Entry>,
    slots: Vec<Slot>,
    tick: u64,
    rng: SmallRng,
    /// Deepest level admitted.
    limit: u32,
    max_limit: u32,
    win_lookups: u64,
    win_misses: u64,
    pub hits: u64,
    pub misses: u64,
}

impl Cache {
    /// A cache of at most `cap` bytes of objects; `max_depth` bounds the adaptive level limit.
    pub fn new(cap: usize, max_depth: u32) -> Cache {
        Cache {
            cap,
            used: 0,
            map: BTreeMap::new(),
            slots: Vec::new(),
            tick: 0,
            rng: SmallRng::seed_from_u64(0x5eed),
            limit: max_depth,
            max_limit: max_depth,
            win_lookups: 0,
            win_misses: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Current deepest admitted level.
    pub fn level_limit(&self) -> u32 {
        self.limit
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The cached object at `addr` if it holds at least `len` bytes.
    pub fn get(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        self.get_ref(addr, len).map(<[u8]>::to_vec)
    }

    /// [`Cache::get`] without the copy.
    pub fn get_ref(&mut self, addr: u64, len: usize) -> Option<&[u8]> {
        self.tick += 1;
        self.win_lookups += 1;
        let hit = match self.map.get(&addr) {
            Some(e) if e.data.len() >= len => {
                self.slots[e.slot].last = self.tick;
                self.hits += 1;
                true
            }
            _ => {
                self.misses += 1;
                self.win_misses += 1;
                false
            }
        };
        if self.win_lookups >= WINDOW {
            let ratio = self.win_misses as f64 / self.win_lookups as f64;
            if ratio > 0.5 && self.limit > 0 {
                self.limit -= 1;
            } else if ratio < 0.25 && self.limit < self.max_limit {
                self.limit += 1;
            }
            self.win_lookups = 0;
            self.win_misses = 0;
        }
        if hit {
            self.map.get(&addr).map(|e| &e.data[..len])
        } else {
            None
        }
    }

    /// Whether an object at `depth` is admitted now.
    pub fn admits(&self, depth: u32) -> bool {
        self.cap > 0 && depth <= self.limit
    }

    /// Caches `data` as the object at `addr` (if its level is admitted).
    pub fn insert(&mut self, addr: u64, data: Vec<u8>, depth: u32) {
        if !self.admits(depth) || data.len() > self.cap {
            return;
        }
        self.remove(addr);
        while self.used + data.len() > self.cap && !self.slots.is_empty() {
            self.evict_one();
        }
        self.tick += 1;
        self.used += data.len();
        self.map.insert(
            addr,
            Entry {
                data,
                slot: self.slots.len(),
            },
        );
        self.slots.push(Slot {
            addr,
            depth,
            last: self.tick,
        });
    }

    /// Applies a write to every cached object it overlaps.
    pub fn write(&mut self, addr: u64, data: &[u8]) {
        let end = addr + data.len() as u64;
        let first = self.map.range(..=addr).next_back().map(|(k, _)| *k).unwrap_or(addr);
        for (&k, e) in self.map.range_mut(first..end) {
            let kend = k + e.data.len() as u64;
            if kend <= addr {
                continue;
            }
            let lo = addr.max(k);
            let hi = end.min(kend);
            e.data[(lo - k) as usize..(hi - k) as usize]
                .copy_from_slice(&data[(lo - addr) as usize..(hi - addr) as usize]);
        }
    }

    /// Drops the object at `addr` (freed memory).
    pub fn remove(&mut self, addr: u64) {
        if let Some(e) = self.map.remove(&addr) {
            self.used -= e.data.len();
            let i = e.slot;
            self.slots.swap_remove(i);
            if let Some(moved) = self.slots.get(i) {
                self.map.get_mut(&moved.addr).expect("indexed").slot = i;
            }
        }
    }

    /// Drops everything (after the back-end restarted).
    pub fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.used = 0;
    }

    /// Evicts the least recently used of the deepest level in a random sample.
    fn evict_one(&mut self) {
        let n = self.slots.len();
        let rank = |s: &Slot| (std::cmp::Reverse(s.depth), s.last);
        let mut victim = self.slots[self.rng.gen_range(0..n)];
        for _ in 1..SAMPLE.min(n) {
            let s = self.slots[self.rng.gen_range(0..n)];
            if rank(&s) < rank(&victim) {
                victim = s;
            }
        }
        self.remove(victim.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_bytes_and_writes_update_in_place() {
        let mut c = Cache::new(1000, 3);
        for i in 0..100u64 {
            c.insert(i * 100, vec![i as u8; 100], 0);
            assert!(c.used <= 1000);
        }
        assert_eq!(c.len(), 10);
        let k = c.slots.first().unwrap().addr;
        c.write(k + 50, &[7; 80]);
        let got = c.get(k, 100).unwrap();
        assert_eq!(&got[50..], &[7; 50][..]);
        assert_eq!(got[49], (k / 100) as u8);
        // The write reached into the next object too, if it is cached.
        if let Some(next) = c.get(k + 100, 100) {
            assert_eq!(&next[..30], &[7; 30][..]);
        }
    }

    #[test]
    fn recently_used_entries_survive_sampled_eviction() {
        let mut c = Cache::new(64 * 100, 3);
        for i in 0..100u64 {
            c.insert(i * 64, vec![0; 64], 0);
        }
        for round in 0..50u64 {
            // Keep the first ten hot, stream new objects through.
            for i in 0..10u64 {
                c.get(i * 64, 64);
            }
            c.insert(100_000 + round * 64, vec![0; 64], 0);
        }
        let hot = (0..10u64).filter(|i| c.map.contains_key(&(i * 64))).count();
        assert_eq!(hot, 10, "hot entries evicted");
    }

    #[test]
    fn leaves_are_evicted_before_the_inner_nodes_that_route_to_them() {
        // 16 inner nodes (depth 1) used once, long ago; leaves (depth 2)
        // stream through, each used more recently than any inner node.
        let mut c = Cache::new(64 * 100, 3);
        for i in 0..16u64 {
            c.insert(i * 64, vec![0; 64], 1);
        }
        for i in 0..1000u64 {
            c.insert((1 << 20) + i * 64, vec![0; 64], 2);
        }
        let inner = (0..16u64).filter(|i| c.map.contains_key(&(i * 64))).count();
        assert_eq!(inner, 16, "an inner node was evicted before a leaf");
        assert!(c.used <= 64 * 100);
    }

    #[test]
    fn level_limit_adapts_to_the_miss_ratio() {
        let mut c = Cache::new(1 << 20, 4);
        assert!(c.admits(4));
        for i in 0..WINDOW {
            c.get(i * 8, 8);
        }
        assert_eq!(c.level_limit(), 3);
        assert!(!c.admits(4));
        c.insert(0, vec![1; 8], 0);
        for _ in 0..WINDOW {
            c.get(0, 8);
        }
        assert_eq!(c.level_limit(), 4);
    }
}
