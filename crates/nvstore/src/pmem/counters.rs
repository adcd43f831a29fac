//! Per-thread counters of flushed cache lines and fences.
//!
//! Each thread owns one cache-line-padded pair of atomics that only it
//! increments, with a plain load and store ([`bump`]); [`Counters::sum`]
//! adds up every thread's pair on demand. Counters are process-wide: a
//! benchmark or `stat` takes differences between two sums. The per-thread
//! slots are the `thread_local` crate's, as the tree's key count's are
//! (`tree::sync::KeyCount`).

use std::sync::atomic::{AtomicU64, Ordering};
use thread_local::ThreadLocal;

#[derive(Default)]
#[repr(align(64))]
struct Slot {
    flushes: AtomicU64,
    fences: AtomicU64,
}

/// One slot per thread (a new thread may inherit an exited one's slot,
/// counts and all: sums stay whole, and differences stay right).
static SLOTS: ThreadLocal<Slot> = ThreadLocal::new();

#[inline]
fn with_slot<R>(f: impl FnOnce(&Slot) -> R) -> R {
    f(SLOTS.get_or_default())
}

/// Counts `lines` flushed cache lines for the calling thread.
#[inline]
pub fn add_flushes(lines: u64) {
    with_slot(|s| bump(&s.flushes, lines));
}

/// Counts one fence for the calling thread.
#[inline]
pub fn add_fence() {
    with_slot(|s| bump(&s.fences, 1));
}

/// Adds `n` to a counter only the calling thread writes: a load and a
/// store, not a read-modify-write. On x86 every atomic read-modify-write
/// is a locked instruction, and a locked instruction waits for the
/// `clwb`s before it: counting a flush that way made every flush wait for
/// its write-back on the spot, as a fence would.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// A sum of flush and fence counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub flushes: u64,
    pub fences: u64,
}

impl Counters {
    /// Sum over every thread that ever flushed or fenced.
    pub fn sum() -> Counters {
        let mut c = Counters::default();
        for s in SLOTS.iter() {
            c.flushes += s.flushes.load(Ordering::Relaxed);
            c.fences += s.fences.load(Ordering::Relaxed);
        }
        c
    }

    pub fn since(self, earlier: Counters) -> Counters {
        Counters {
            flushes: self.flushes - earlier.flushes,
            fences: self.fences - earlier.fences,
        }
    }
}

/// The calling thread's own counts: deterministic even while other threads
/// run, so tests may assert flushes per operation.
pub struct ThreadCounters;

impl ThreadCounters {
    pub fn get() -> Counters {
        with_slot(|s| Counters {
            flushes: s.flushes.load(Ordering::Relaxed),
            fences: s.fences.load(Ordering::Relaxed),
        })
    }
}
