//! A shared value replaced whole, read under an epoch pin: the index and
//! its PLNs.
//!
//! `arc_swap::ArcSwap` protects a reader's load by writing the pointer into
//! a per-thread debt slot and clearing it at the guard's drop: two
//! sequentially consistent stores per load, on a path that pins an epoch
//! anyway. A point operation loads the index and a PLN, and those stores
//! were about a twentieth of a lookup of 1M keys (BENCHMARKS.md, "The index
//! and its PLNs read under the epoch pin"). Here a reader that holds a pin
//! reads a plain pointer instead ([`Swap::get`]), and a writer that
//! replaces the value hands the old `Arc` to the epoch collector rather
//! than dropping it, so it outlives every reader pinned before the swap
//! (the rule crossbeam-epoch's own `Atomic` follows). Written by hand
//! because crossbeam's `Atomic` owns a `Box`, and callers that keep the
//! value past their pin (cursors, rebuilds) need an `Arc`.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use crossbeam_epoch as epoch;

/// One `Arc<T>`, swapped whole; see the module comment.
pub struct Swap<T> {
    /// `Arc::into_raw` of the current value: this `Swap` owns one strong
    /// count of it.
    ptr: AtomicPtr<T>,
    _owns: PhantomData<Arc<T>>,
}

impl<T> Swap<T> {
    pub fn new(value: Arc<T>) -> Self {
        Swap {
            ptr: AtomicPtr::new(Arc::into_raw(value).cast_mut()),
            _owns: PhantomData,
        }
    }

    pub fn from_pointee(value: T) -> Self {
        Swap::new(Arc::new(value))
    }

    /// The current value, borrowed for as long as `pin` is held: no
    /// reference count is touched.
    #[inline]
    #[allow(unsafe_code)]
    pub fn get<'g>(&'g self, pin: &'g epoch::Guard) -> &'g T {
        let _ = pin;
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: `p` came from `Arc::into_raw` and this `Swap` held a
        // strong count of it at the load. That count is released only by
        // `store`, which defers the release to the epoch collector (so it
        // runs after every thread pinned before the swap, `pin`'s holder
        // included, has unpinned), or by `drop`, which needs `self` no
        // longer borrowed, so not before `'g` ends. `pin` is a real pin:
        // safe code cannot get crossbeam's unprotected guard.
        unsafe { &*p }
    }

    /// A counted reference to the current value, for a caller that keeps
    /// it past its pin.
    #[allow(unsafe_code)]
    pub fn load(&self) -> Arc<T> {
        let pin = epoch::pin();
        let p: *const T = self.get(&pin);
        // SAFETY: `p` is alive while `pin` is held (see `get`) and came
        // from `Arc::into_raw`; the new count is owned by the result.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    /// Replaces the value. Readers that loaded the old one keep it until
    /// they unpin (or drop their `Arc`). The old value waits in this
    /// thread's epoch bag: a caller that wants it dropped soon flushes the
    /// bag (`epoch::pin().flush()`) once it has deferred all it had to.
    /// A split replaces a PLN, defers its old leaves' release, and then
    /// flushes once for both: each flush seals and queues the bag and
    /// tries a collection.
    #[allow(unsafe_code)]
    pub fn store(&self, value: Arc<T>)
    where
        T: Send + Sync + 'static,
    {
        let old = self.ptr.swap(Arc::into_raw(value).cast_mut(), Ordering::AcqRel);
        // SAFETY: `old` came from `Arc::into_raw`, and the count this
        // `Swap` owned moves to the `Arc` rebuilt here.
        let old = unsafe { Arc::from_raw(old) };
        epoch::pin().defer(move || drop(old));
    }
}

impl<T> Drop for Swap<T> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Arc::into_raw` and this `Swap`
        // owns one count; with `&mut self` no `get` borrow is alive.
        drop(unsafe { Arc::from_raw(*self.ptr.get_mut()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counted(Arc<AtomicUsize>, u64);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_replaced_value_lives_until_its_readers_unpin() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let s = Swap::from_pointee(Counted(dropped.clone(), 1));
        let pin = epoch::pin();
        let old = s.get(&pin);
        s.store(Arc::new(Counted(dropped.clone(), 2)));
        // The reader still holds its pin: the old value is not dropped,
        // however often the collector runs.
        for _ in 0..1000 {
            epoch::pin().flush();
        }
        assert_eq!(old.1, 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(pin);
        // Unpinned: the collector may now drop it.
        // Other tests' threads pin too; give them time to unpin.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while dropped.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            epoch::pin().flush();
            std::thread::yield_now();
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(s.load().1, 2);
        drop(s);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn readers_on_other_threads_see_whole_values() {
        let s = Arc::new(Swap::from_pointee((0u64, 0u64)));
        std::thread::scope(|sc| {
            for _ in 0..2 {
                let s = &s;
                sc.spawn(move || {
                    for _ in 0..20_000 {
                        let pin = epoch::pin();
                        let v = s.get(&pin);
                        assert_eq!(v.0 * 2, v.1);
                        let a = s.load();
                        assert_eq!(a.0 * 2, a.1);
                    }
                });
            }
            for i in 1..20_000u64 {
                s.store(Arc::new((i, 2 * i)));
            }
        });
    }
}
