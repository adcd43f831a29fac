//! What a writer touches after its fence: the leaf lock and the key count,
//! neither of which takes a locked instruction there.
//!
//! A writer releases its leaf's lock, and counts a key it added, right
//! after the fence that makes its element durable. On the machines
//! measured, any locked instruction there (the compare-exchange of a
//! parking mutex's release, an `xchg`, a `lock xadd` on a shared counter)
//! is a full barrier that waits until the line just flushed has been
//! written back: together about a fifth of an insert's time (BENCHMARKS.md,
//! "No locked instruction after a write's fence"). Here the release is a release
//! store, and the count is kept per thread with a load and a store.
//!
//! The lock's price is that a waiter cannot be woken, since waking needs
//! the releaser to look for waiters after its store, which takes the
//! barrier this lock exists to avoid. A waiter spins briefly, then yields,
//! then sleeps for a growing while (up to [`MAX_SLEEP`]). Leaf locks are
//! held for one append, or for one split or one transaction's appends, and
//! two writers rarely want one leaf at once, so waiting is rare and short.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// The longest a waiter sleeps before it looks again.
pub const MAX_SLEEP: Duration = Duration::from_micros(200);

/// A mutual-exclusion lock over no data (the leaf's words in the pool are
/// what it guards).
#[derive(Debug, Default)]
pub struct LeafLock {
    held: AtomicBool,
}

/// Holds a [`LeafLock`] until dropped.
#[must_use = "the lock is released when the guard is dropped"]
#[derive(Debug)]
pub struct LeafGuard<'a> {
    lock: &'a LeafLock,
}

impl LeafLock {
    pub const fn new() -> LeafLock {
        LeafLock {
            held: AtomicBool::new(false),
        }
    }

    /// Takes the lock, waiting as long as it takes.
    #[inline]
    pub fn lock(&self) -> LeafGuard<'_> {
        if self.try_acquire() {
            return LeafGuard { lock: self };
        }
        self.lock_slow()
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[cold]
    fn lock_slow(&self) -> LeafGuard<'_> {
        let mut round = 0u32;
        loop {
            // Wait for it to look free before trying again, so waiters do
            // not take the line away from the holder with failed exchanges.
            while self.held.load(Ordering::Relaxed) {
                round = round.saturating_add(1);
                match round {
                    0..64 => std::hint::spin_loop(),
                    64..80 => std::thread::yield_now(),
                    _ => std::thread::sleep(Duration::from_micros(1 << (round - 80).min(8)).min(MAX_SLEEP)),
                }
            }
            if self.try_acquire() {
                return LeafGuard { lock: self };
            }
        }
    }
}

impl Drop for LeafGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

/// A count of keys that many threads change and few read: each thread
/// adds to its own word with a load and a store (no read-modify-write), a
/// read sums the words. Exact once the writers' changes are visible.
#[derive(Debug, Default)]
pub struct KeyCount {
    base: i64,
    mine: thread_local::ThreadLocal<AtomicI64>,
}

impl KeyCount {
    /// A count that starts at `n`.
    pub fn new(n: i64) -> KeyCount {
        KeyCount {
            base: n,
            mine: thread_local::ThreadLocal::new(),
        }
    }

    /// Adds `d` (negative to take away).
    #[inline]
    pub fn add(&self, d: i64) {
        let w = self.mine.get_or(|| AtomicI64::new(0));
        // Only this thread stores to `w`.
        w.store(w.load(Ordering::Relaxed) + d, Ordering::Relaxed);
    }

    /// The count: the start plus every thread's changes.
    pub fn get(&self) -> i64 {
        self.base + self.mine.iter().map(|w| w.load(Ordering::Relaxed)).sum::<i64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn a_held_lock_is_not_taken_twice() {
        let l = LeafLock::new();
        let g = l.lock();
        assert!(l.held.load(Ordering::Relaxed));
        assert!(!l.try_acquire(), "taken while held");
        drop(g);
        assert!(!l.held.load(Ordering::Relaxed));
        assert!(l.try_acquire(), "free after release");
    }

    #[test]
    fn waiters_get_the_lock_once_released_and_exclude_each_other() {
        // A counter bumped with separate load and store under the lock: a
        // lost increment means two holders at once.
        let l = Arc::new(LeafLock::new());
        let n = Arc::new(AtomicU64::new(0));
        let held = l.lock();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (l, n) = (l.clone(), n.clone());
                std::thread::spawn(move || {
                    for i in 0..2_000u32 {
                        let _g = l.lock();
                        let v = n.load(Ordering::Relaxed);
                        if i % 500 == 0 {
                            // Sometimes hold it long enough that waiters sleep.
                            std::thread::sleep(Duration::from_micros(300));
                        }
                        n.store(v + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(n.load(Ordering::Relaxed), 0, "a waiter ran while the lock was held");
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(n.load(Ordering::Relaxed), 8_000);
    }

    #[test]
    fn the_key_count_sums_every_threads_changes() {
        let c = Arc::new(KeyCount::new(10));
        c.add(-3);
        std::thread::scope(|s| {
            for t in 0..4i64 {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1_000 {
                        c.add(t);
                        c.add(-1);
                    }
                });
            }
        });
        // 10 - 3 + 1000 * (0 + 1 + 2 + 3) - 4000
        assert_eq!(c.get(), 7 + 6_000 - 4_000);
    }
}
