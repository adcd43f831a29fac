//! Range scans: an iterator that reads one leaf at a time, and snapshot
//! pins that keep the versions a reader needs.

use std::ops::{Bound as RB, ControlFlow};
use std::path::Path;
use std::sync::Arc;

use crossbeam_epoch as epoch;

use super::collate::Keep;
use super::collate::Slot;
use super::index::{Bound, Found, Index};
use super::leaf::{LeafFormat, ValueRef};
use super::{KeyBound, Tree};
use crate::error::{Error, Result};
use crate::format::element;
use crate::pmem::Space;

impl<S: Space, L: LeafFormat> Tree<S, L> {
    /// The live elements of one leaf within the range, in key order. Values
    /// that live in blobs are read now, while the epoch is pinned; inline
    /// keys and values are materialised only when the iterator yields them.
    fn leaf_range(&self, f: &Found<L::State>, lo: &KeyBound, hi: &KeyBound, at: u64) -> Result<Vec<Pending>> {
        self.sound(&f.leaf)?;
        Ok(L::collate_leaf(&*self.space, &f.leaf, Keep::At(at), lo, hi)
            .valid
            .into_iter()
            .map(|e| {
                let blob_value = e
                    .value_in_blob()
                    .then(|| element::element_value(&*self.space, &e.words));
                Pending { slot: e, blob_value }
            })
            .collect())
    }

    /// Iterator over `[lo, hi]` in key order (or reverse), reading one leaf at a time.
    pub fn range(self: &Arc<Self>, lo: KeyBound, hi: KeyBound, reverse: bool) -> RangeIter<S, L> {
        self.range_at(lo, hi, reverse, None)
    }

    /// Like [`Tree::range`], as of a pinned snapshot (which the iterator
    /// keeps alive).
    pub fn range_at(
        self: &Arc<Self>,
        lo: KeyBound,
        hi: KeyBound,
        reverse: bool,
        pin: Option<Arc<SnapshotPin<S, L>>>,
    ) -> RangeIter<S, L> {
        RangeIter {
            tree: self.clone(),
            span: Span {
                lo,
                hi,
                reverse,
                done: false,
            },
            at: pin.as_ref().map_or(u64::MAX, |p| p.ts),
            _pin: pin,
            buf: Vec::new(),
            error: None,
            pool: None,
        }
    }

    /// Registers a snapshot at the newest published timestamp; the
    /// versions it reads are kept until the pin is dropped.
    pub fn pin_snapshot(self: &Arc<Self>) -> Arc<SnapshotPin<S, L>> {
        Arc::new(SnapshotPin {
            ts: self.clock.pin(),
            tree: self.clone(),
        })
    }
}

/// A registered snapshot: while it lives, rewrites keep the versions it reads.
pub struct SnapshotPin<S: Space, L: LeafFormat> {
    tree: Arc<Tree<S, L>>,
    pub ts: u64,
}

impl<S: Space, L: LeafFormat> Drop for SnapshotPin<S, L> {
    fn drop(&mut self) {
        self.tree.clock.unpin(self.ts);
    }
}

/// An element found by a range scan, not yet turned into a (key, value) pair.
struct Pending {
    slot: Slot,
    blob_value: Option<Vec<u8>>,
}

impl Pending {
    fn into_pair(self) -> (Vec<u8>, Vec<u8>) {
        let v = match self.blob_value {
            Some(v) => v,
            None => self.slot.inline_value().expect("inline value"),
        };
        (self.slot.key(), v)
    }
}

/// Whether no key lies in `[lo, hi]` (the bounds cross, or meet with one excluded).
pub fn no_keys_between(lo: &KeyBound, hi: &KeyBound) -> bool {
    match (lo, hi) {
        (RB::Included(l) | RB::Excluded(l), RB::Included(h) | RB::Excluded(h)) => {
            l > h || (l == h && (matches!(lo, RB::Excluded(_)) || matches!(hi, RB::Excluded(_))))
        }
        _ => false,
    }
}

pub fn in_range(k: &[u8], lo: &KeyBound, hi: &KeyBound) -> bool {
    let above = match lo {
        RB::Unbounded => true,
        RB::Included(l) => k >= l.as_slice(),
        RB::Excluded(l) => k > l.as_slice(),
    };
    let below = match hi {
        RB::Unbounded => true,
        RB::Included(h) => k <= h.as_slice(),
        RB::Excluded(h) => k < h.as_slice(),
    };
    above && below
}

/// Range iterator: refills from one leaf at a time, so it never holds a
/// leaf across calls and sees each leaf as of the moment it was read.
pub struct RangeIter<S: Space, L: LeafFormat> {
    tree: Arc<Tree<S, L>>,
    span: Span,
    /// Timestamp read at (`u64::MAX`: the latest state).
    at: u64,
    _pin: Option<Arc<SnapshotPin<S, L>>>,
    /// Pending elements, in reverse of the order they are yielded.
    buf: Vec<Pending>,
    /// The damage that stopped the iterator, until [`RangeIter::checked`] hands it on.
    error: Option<Error>,
    /// The pool file's path, attached to that error ([`Error::at`]).
    pool: Option<Arc<Path>>,
}

/// The part of a range a scan has not visited yet, walked one leaf at a
/// time (forward from `lo`, or backward from `hi`).
struct Span {
    lo: KeyBound,
    hi: KeyBound,
    reverse: bool,
    done: bool,
}

impl Span {
    /// Whether nothing is left: the scan ended, or the bounds cross.
    fn finished(&mut self) -> bool {
        if no_keys_between(&self.lo, &self.hi) {
            self.done = true;
        }
        self.done
    }

    /// The leaf that holds the next keys of the span.
    fn route<St>(&self, idx: &Index<St>) -> Found<St> {
        if self.reverse {
            match &self.hi {
                RB::Unbounded => idx.find_last(),
                RB::Included(k) | RB::Excluded(k) => idx.find(k),
            }
        } else {
            match &self.lo {
                RB::Unbounded => idx.find(b""),
                RB::Included(k) => idx.find(k),
                RB::Excluded(k) => idx.find_gt(k),
            }
        }
    }

    /// Drops the keys of leaf `f` (just visited) from the span.
    fn advance<St>(&mut self, f: &Found<St>) {
        if self.reverse {
            match &f.low {
                Bound::NegInf | Bound::PosInf => self.done = true,
                Bound::Key(k) => self.hi = RB::Included(k.to_vec()),
            }
        } else {
            match &f.high {
                Bound::PosInf => self.done = true,
                Bound::Key(k) => self.lo = RB::Excluded(k.to_vec()),
                Bound::NegInf => {}
            }
        }
    }
}

impl<S: Space, L: LeafFormat> Tree<S, L> {
    /// Calls `f` on each pair in `[lo, hi]` as of `at`, in key order (or
    /// reverse), until it breaks. Keys and values are lent, not copied: an
    /// inline one from the stack, one in a blob straight from the pool
    /// where the space maps it. Reads one leaf at a time, with the epoch
    /// pinned while `f` runs on that leaf's pairs, so `f` should not block
    /// for long; each leaf is seen as of the moment it was read.
    pub fn scan_with(
        &self,
        lo: KeyBound,
        hi: KeyBound,
        reverse: bool,
        at: u64,
        mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let mut span = Span {
            lo,
            hi,
            reverse,
            done: false,
        };
        let s = &*self.space;
        while !span.finished() {
            let _g = epoch::pin();
            let idx = self.index.load();
            let found = span.route(&idx);
            self.sound(&found.leaf)?;
            let c = L::collate_leaf(s, &found.leaf, Keep::At(at), &span.lo, &span.hi);
            let mut visit = |e: &Slot| e.with_key(|k| ValueRef::of(s, &e.words).with(s, |v| f(k, v)));
            let flow = if reverse {
                c.valid.iter().rev().try_for_each(&mut visit)
            } else {
                c.valid.iter().try_for_each(&mut visit)
            };
            if flow.is_break() {
                break;
            }
            span.advance(&found);
        }
        Ok(())
    }
}

impl<S: Space, L: LeafFormat> RangeIter<S, L> {
    fn refill(&mut self) {
        while self.buf.is_empty() && !self.span.finished() {
            let _g = epoch::pin();
            let idx = self.tree.index.load();
            let f = self.span.route(&idx);
            let mut pairs = match self.tree.leaf_range(&f, &self.span.lo, &self.span.hi, self.at) {
                Ok(p) => p,
                Err(e) => {
                    self.error = Some(match &self.pool {
                        Some(p) => e.at(p),
                        None => e,
                    });
                    self.span.done = true;
                    return;
                }
            };
            // buf pops from the end: ascending for a reverse scan (the
            // largest comes first), descending for a forward one.
            if !self.span.reverse {
                pairs.reverse();
            }
            self.buf = pairs;
            self.span.advance(&f);
        }
    }
}

impl<S: Space, L: LeafFormat> RangeIter<S, L> {
    /// This iterator, naming the pool file `pool` in the error it meets
    /// (the `Db` that hands it out attaches its path).
    pub(crate) fn named(mut self, pool: &Arc<Path>) -> Self {
        self.pool = Some(pool.clone());
        self
    }

    /// The damage that ended this iterator early, if any: as an
    /// `Iterator` of pairs it stops at a damaged leaf (see
    /// [`RangeIter::checked`] for one that yields the error).
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// The next pair, or the damage that stops the iteration (yielded
    /// once; `None` after it).
    pub fn next_checked(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        self.refill();
        match self.buf.pop() {
            Some(p) => Some(Ok(p.into_pair())),
            None => self.error.take().map(Err),
        }
    }

    /// This iterator as one of `Result`s: pairs, then at most one error.
    pub fn checked(self) -> Checked<Self> {
        Checked(self)
    }
}

impl<S: Space, L: LeafFormat> Iterator for RangeIter<S, L> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        self.refill();
        self.buf.pop().map(Pending::into_pair)
    }
}

/// An iterator of `Result`s over a range: every pair, then the damage that
/// stopped it (once), then nothing.
pub struct Checked<I>(I);

impl<S: Space, L: LeafFormat> Iterator for Checked<RangeIter<S, L>> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_checked()
    }
}
