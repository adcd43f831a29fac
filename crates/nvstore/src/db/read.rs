//! Reads: point lookups, scans lending pairs in place, and the range
//! iterator over a pool of any engine.

use std::ops::{Bound as RB, ControlFlow, RangeBounds};

use super::{Db, Engine};
use crate::error::{Error, Result};
use crate::hash::engine::HashIter;
use crate::pmem::Space;
use crate::tree::isle::Isle;
use crate::tree::nv::Nv;
use crate::tree::RangeIter;

impl<S: Space> Db<S> {
    /// The value stored for `key` (a copy: [`Db::get_with`] reads it in place).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_with(key, <[u8]>::to_vec)
    }

    /// [`Db::get`] of each of `keys`: one result per key, in order. On a
    /// hash pool the lookups run as one batch that overlaps their cache
    /// misses (each key's bucket lines, then each candidate's blob, are
    /// fetched before any key is looked up), under one hold of the table's
    /// read lock; a batch of a few dozen keys is faster than as many
    /// `get`s. On a tree pool it is the same as calling `get` for each.
    /// [`AsyncDb`](crate::AsyncDb)'s workers read the gets they take off
    /// the queue together this way.
    pub fn get_many(&self, keys: &[&[u8]]) -> Vec<Result<Option<Vec<u8>>>> {
        match &self.engine {
            Engine::Hash(h) if keys.len() > 1 => {
                let mut out: Vec<Result<Option<Vec<u8>>>> = keys.iter().map(|_| Ok(None)).collect();
                h.get_many_with(keys, |i, r| out[i] = self.named(r.map(|v| v.map(<[u8]>::to_vec))));
                out
            }
            _ => keys.iter().map(|k| self.get(k)).collect(),
        }
    }

    /// Runs `f` on the value stored for `key` without copying it out of
    /// the pool (no allocation): `Ok(None)` when `key` has no value.
    /// `f` runs inside the read, which holds back the reclamation of
    /// replaced values meanwhile, so keep it short and do not block in it.
    /// On a hash pool it runs under the table's read lock (writers wait for
    /// it), so it must not call into this `Db`: a write would wait for it,
    /// and a second read could queue behind a waiting writer.
    ///
    /// ```no_run
    /// # let db = nvstore::Db::open("/dev/shm/doc.pool", nvstore::Options::default())?;
    /// let len = db.get_with(b"user:1", |v| v.len())?;
    /// let starts = db.get_with(b"user:1", |v| v.starts_with(b"{"))?.unwrap_or(false);
    /// # Ok::<(), nvstore::Error>(())
    /// ```
    #[inline]
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        crate::tree::check_key(key)?;
        self.named(with_tree!(self, t => t.get_with(key, f), h => h.get_with(key, f)))
    }

    /// Calls `f` on each pair with a key in `range`, in key order, lending
    /// key and value without copying them, until `f` returns
    /// [`ControlFlow::Break`]. The scan reads one leaf at a time (as
    /// [`Db::range`] does) and `f` runs while that leaf's read is in
    /// progress: keep it short. Stops at the first damaged leaf with its
    /// [`Error::Corrupt`]. On a hash pool `f` runs under the table's read
    /// lock, as for [`Db::get_with`], so it must not call into this `Db`.
    ///
    /// ```no_run
    /// # use std::ops::ControlFlow;
    /// # let db = nvstore::Db::open("/dev/shm/doc.pool", nvstore::Options::default())?;
    /// let mut bytes = 0;
    /// db.range_with(&b"a"[..]..&b"b"[..], |_k, v| {
    ///     bytes += v.len();
    ///     ControlFlow::Continue(())
    /// })?;
    /// # Ok::<(), nvstore::Error>(())
    /// ```
    pub fn range_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = owned_bounds(&range);
        self.named(with_tree!(self, t => t.scan_with(lo, hi, false, u64::MAX, f), h => h.scan_with(lo, hi, false, f)))
    }

    /// [`Db::range_with`] in reverse key order.
    pub fn range_rev_with<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (lo, hi) = owned_bounds(&range);
        self.named(with_tree!(self, t => t.scan_with(lo, hi, true, u64::MAX, f), h => h.scan_with(lo, hi, true, f)))
    }

    /// [`Db::range_with`] over the pairs whose key starts with `prefix`.
    pub fn prefix_with(&self, prefix: &[u8], f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>) -> Result<()> {
        let (lo, hi) = prefix_bounds(prefix);
        self.named(with_tree!(self, t => t.scan_with(lo, hi, false, u64::MAX, f), h => h.scan_with(lo, hi, false, f)))
    }

    /// [`Db::range_with`] over every pair.
    pub fn for_each(&self, f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>) -> Result<()> {
        self.named(with_tree!(self, t => t.scan_with(RB::Unbounded, RB::Unbounded, false, u64::MAX, f), h => h.scan_with(RB::Unbounded, RB::Unbounded, false, f)))
    }

    /// Pairs with keys in `range`, in key order.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter<S> {
        let (lo, hi) = owned_bounds(&range);
        self.iter_over(lo, hi, false)
    }

    /// Pairs with keys in `range`, in reverse key order.
    pub fn range_rev<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter<S> {
        let (lo, hi) = owned_bounds(&range);
        self.iter_over(lo, hi, true)
    }

    /// Every pair, in key order.
    pub fn iter(&self) -> Iter<S> {
        self.iter_over(RB::Unbounded, RB::Unbounded, false)
    }

    /// Pairs whose key starts with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Iter<S> {
        let (lo, hi) = prefix_bounds(prefix);
        self.iter_over(lo, hi, false)
    }

    /// Pairs whose key starts with `prefix`, in reverse key order.
    pub fn prefix_rev(&self, prefix: &[u8]) -> Iter<S> {
        let (lo, hi) = prefix_bounds(prefix);
        self.iter_over(lo, hi, true)
    }

    fn iter_over(&self, lo: RB<Vec<u8>>, hi: RB<Vec<u8>>, reverse: bool) -> Iter<S> {
        match &self.engine {
            Engine::Nv(t) => Iter::Nv(t.range(lo, hi, reverse).named(&self.path)),
            Engine::Isle(t) => Iter::Isle(t.range(lo, hi, reverse).named(&self.path)),
            Engine::Hash(h) => Iter::Hash(h.range(lo, hi, reverse)),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> u64 {
        with_tree!(self, t => t.len(), h => h.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A range iterator over a pool of any engine.
pub enum Iter<S: Space> {
    Nv(RangeIter<S, Nv>),
    Isle(RangeIter<S, Isle>),
    Hash(HashIter<S>),
}

/// As an `Iterator` of pairs, an `Iter` ends early at a damaged leaf and
/// keeps the error ([`Iter::error`]); [`Iter::checked`] turns it into an
/// iterator of `Result`s that yields that error once, then stops.
impl<S: Space> Iterator for Iter<S> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Nv(i) => i.next(),
            Iter::Isle(i) => i.next(),
            Iter::Hash(i) => i.next(),
        }
    }
}

impl<S: Space> Iter<S> {
    /// The damage that ended the iteration early, if any.
    pub fn error(&self) -> Option<&Error> {
        match self {
            Iter::Nv(i) => i.error(),
            Iter::Isle(i) => i.error(),
            Iter::Hash(i) => i.error(),
        }
    }

    /// The next pair, or the damage that stops the iteration (once).
    pub fn next_checked(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        match self {
            Iter::Nv(i) => i.next_checked(),
            Iter::Isle(i) => i.next_checked(),
            Iter::Hash(i) => i.next_checked(),
        }
    }

    /// This iterator as one of `Result`s: every pair, then at most one
    /// [`Error::Corrupt`] naming the damaged leaf, then nothing.
    pub fn checked(self) -> CheckedIter<S> {
        CheckedIter(self)
    }
}

/// See [`Iter::checked`].
pub struct CheckedIter<S: Space>(Iter<S>);

impl<S: Space> Iterator for CheckedIter<S> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_checked()
    }
}

pub(crate) fn owned(b: RB<&impl AsRef<[u8]>>) -> RB<Vec<u8>> {
    match b {
        RB::Included(k) => RB::Included(k.as_ref().to_vec()),
        RB::Excluded(k) => RB::Excluded(k.as_ref().to_vec()),
        RB::Unbounded => RB::Unbounded,
    }
}

fn owned_bounds<K: AsRef<[u8]>, R: RangeBounds<K>>(r: &R) -> (RB<Vec<u8>>, RB<Vec<u8>>) {
    (owned(r.start_bound()), owned(r.end_bound()))
}

/// `[prefix, successor(prefix))`; unbounded above when the prefix is all 0xff.
pub fn prefix_bounds(prefix: &[u8]) -> (RB<Vec<u8>>, RB<Vec<u8>>) {
    let mut end = prefix.to_vec();
    while let Some(&b) = end.last() {
        if b == 0xff {
            end.pop();
        } else {
            *end.last_mut().unwrap() += 1;
            return (RB::Included(prefix.to_vec()), RB::Excluded(end));
        }
    }
    (RB::Included(prefix.to_vec()), RB::Unbounded)
}
