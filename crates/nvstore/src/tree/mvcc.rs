//! Timestamps, in-flight writers and live snapshots (NV-Tree §6.1.1).
//!
//! Every write takes a commit timestamp from one counter while it holds the
//! lock of the leaf it appends to, so a key's elements are appended in
//! timestamp order. A snapshot reads at timestamp `S` and must never see a
//! write with timestamp `<= S` appear later; so before a snapshot is handed
//! out, every writer that may hold such a timestamp is waited for. Writers
//! announce themselves in a slot of a small array (their own cache line):
//! a slot is `PENDING` from before the writer takes its timestamp, then the
//! timestamp, then 0 once the write is published. The wait is short: a
//! writer holds a slot only across one append (or one transaction's appends
//! and its commit record), never across a lock wait or an allocation.
//!
//! Live snapshots are counted per timestamp. Rewriting a leaf (split,
//! replace, merge) keeps every version the oldest live snapshot can see and
//! drops the rest ([`crate::tree::collate::Keep::Since`]). The registry lock
//! orders snapshot creation against the rewrite reading the oldest one: a
//! snapshot taken after that read has a timestamp no lower than it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// A slot value: the writer is about to take a timestamp.
const PENDING: u64 = u64::MAX;
const SLOTS: usize = 64;

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicU64);

/// The commit-timestamp counter and the snapshot registry of one tree.
pub struct Clock {
    last: AtomicU64,
    slots: Box<[Padded]>,
    snapshots: Mutex<BTreeMap<u64, usize>>,
    /// Snapshots live or being taken: raised before a snapshot reads its
    /// timestamp, lowered after it is released (see [`Clock::quiet`]).
    live: Padded,
}

/// A writer's hold on its timestamp; the slot is released on drop (after
/// the write is published).
pub struct Writing<'a> {
    slot: &'a AtomicU64,
    pub ts: u64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        // Release, not SeqCst: a snapshot that reads this 0 (a SeqCst load,
        // so an acquire) sees every store of the write. A SeqCst store is
        // an `xchg`, a full barrier that waits for the write's flushes to
        // drain; it took a tenth of an insert's time.
        self.slot.store(0, Ordering::Release);
    }
}

static NEXT_HINT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static HINT: usize = NEXT_HINT.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

impl Clock {
    /// A clock whose last handed-out timestamp is `last`.
    pub fn new(last: u64) -> Clock {
        Clock {
            last: AtomicU64::new(last),
            slots: (0..SLOTS).map(|_| Padded::default()).collect(),
            snapshots: Mutex::new(BTreeMap::new()),
            live: Padded::default(),
        }
    }

    /// Writes are refused (see [`crate::Error::ClockExhausted`]) once the
    /// clock passes this mark, so the concurrent writers between the check
    /// and [`Clock::begin_write`] (fewer than 2^20) never run out.
    pub const LIMIT: u64 = crate::format::leaf_nv::VERSION_MASK - (1 << 20);

    /// Whether a new write may take a timestamp (see [`Clock::LIMIT`]).
    pub fn has_room(&self) -> bool {
        self.last() < Self::LIMIT
    }

    /// The last timestamp handed out (possibly not yet published).
    pub fn last(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Takes the next timestamp for a write. Hold the result until the
    /// write is published.
    pub fn begin_write(&self) -> Writing<'_> {
        let start = HINT.with(|h| *h);
        let mut i = start;
        let slot = loop {
            let s = &self.slots[i].0;
            if s.compare_exchange(0, PENDING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                break s;
            }
            i = (i + 1) % SLOTS;
            if i == start {
                std::thread::yield_now();
            }
        };
        let ts = self.last.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(ts < crate::format::leaf_nv::VERSION_MASK, "commit timestamps exhausted");
        // Release is enough: the SeqCst CAS to PENDING above is what orders
        // this writer against a snapshot's scan (`visible`), which then reads
        // PENDING, `ts` or the release of `drop`, never the 0 from before;
        // reading PENDING where `ts` already stands only waits longer.
        slot.store(ts, Ordering::Release);
        Writing { slot, ts }
    }

    /// The newest timestamp all of whose writes (and all older ones) are
    /// published: waits for in-flight writers at or below it.
    pub fn visible(&self) -> u64 {
        let s = self.last.load(Ordering::SeqCst);
        for slot in self.slots.iter() {
            let mut spins = 0u32;
            loop {
                let v = slot.0.load(Ordering::SeqCst);
                if v == 0 || (v != PENDING && v > s) {
                    break;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        s
    }

    /// Whether no snapshot is live or being taken, asked by a writer that
    /// holds its timestamp: then no reader can need the version that writer
    /// replaces, and it may overwrite it in place. A snapshot taken
    /// concurrently raises `live` before it reads the clock, so (both
    /// sequentially consistent) either this sees it, or it reads a clock at
    /// or above the writer's timestamp and [`Clock::visible`] waits for the
    /// writer's slot: the snapshot then reads the value written in place.
    pub fn quiet(&self, _w: &Writing<'_>) -> bool {
        self.live.0.load(Ordering::SeqCst) == 0
    }

    /// Registers a snapshot and returns its timestamp.
    pub fn pin(&self) -> u64 {
        self.live.0.fetch_add(1, Ordering::SeqCst);
        let mut reg = self.snapshots.lock();
        let ts = self.visible();
        *reg.entry(ts).or_insert(0) += 1;
        ts
    }

    /// Releases a snapshot taken by [`Clock::pin`].
    pub fn unpin(&self, ts: u64) {
        let mut reg = self.snapshots.lock();
        if let Some(n) = reg.get_mut(&ts) {
            *n -= 1;
            if *n == 0 {
                reg.remove(&ts);
            }
            self.live.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The oldest timestamp any present or future snapshot reads at.
    pub fn oldest(&self) -> u64 {
        let reg = self.snapshots.lock();
        let last = self.last();
        reg.keys().next().map_or(last, |&o| o.min(last))
    }

    /// The oldest live snapshot, if any.
    pub fn oldest_snapshot(&self) -> Option<u64> {
        self.snapshots.lock().keys().next().copied()
    }

    /// Live snapshots.
    pub fn snapshots(&self) -> usize {
        self.snapshots.lock().values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_clock_near_the_version_limit_has_no_room() {
        assert!(Clock::new(Clock::LIMIT - 1).has_room());
        assert!(!Clock::new(Clock::LIMIT).has_room());
        // A damaged version word recovered as the newest timestamp.
        assert!(!Clock::new(crate::format::leaf_nv::VERSION_MASK - 1).has_room());
    }

    #[test]
    fn timestamps_rise_and_snapshots_wait_for_writers() {
        let c = Arc::new(Clock::new(10));
        let w = c.begin_write();
        assert_eq!(w.ts, 11);
        assert_eq!(c.last(), 11);
        // A snapshot must wait until the writer of 11 is done.
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.pin());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!t.is_finished(), "a snapshot did not wait for an in-flight writer");
        drop(w);
        assert_eq!(t.join().unwrap(), 11);
        assert_eq!(c.oldest_snapshot(), Some(11));
        assert_eq!(c.oldest(), 11);
        let w = c.begin_write();
        assert_eq!(w.ts, 12);
        // A writer above the snapshot's timestamp is not waited for.
        assert_eq!(c.oldest(), 11);
        drop(w);
        c.unpin(11);
        assert_eq!(c.oldest_snapshot(), None);
        assert_eq!(c.oldest(), 12);
    }

    #[test]
    fn many_writers_share_the_slots() {
        let c = Arc::new(Clock::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let _w = c.begin_write();
                    }
                });
            }
            for _ in 0..200 {
                let ts = c.pin();
                c.unpin(ts);
            }
        });
        assert_eq!(c.last(), 40_000);
        assert_eq!(c.visible(), 40_000);
    }
}
