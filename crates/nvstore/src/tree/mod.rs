//! The NV-Tree (seed 000 §4): crash-consistent leaves in the pool, inner
//! nodes in DRAM.
//!
//! Concurrency (DESIGN §9):
//! - readers take no locks: they pin an epoch, load the current index, route
//!   to a leaf and scan its elements up to the leaf's *durable* count, a DRAM
//!   copy of the persistent count that is raised only after the count has
//!   been flushed and fenced, so nothing a crash could lose is ever returned
//!   (DESIGN §6 rule 3);
//! - a writer locks one leaf (a DRAM mutex, never a word in the pool);
//! - splits, replaces and merges are serialised by one structure lock; they
//!   build new leaves, swap them in with one sibling-pointer store, publish a
//!   new PLN (or a rebuilt index), mark the old leaves dead and hand their
//!   blocks to epoch-based reclamation. Appends to other leaves go on meanwhile.

pub mod index;
pub mod leaf;

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::ops::Bound as RB;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use crossbeam_epoch as epoch;
use parking_lot::Mutex;

use crate::alloc::Allocator;
use crate::error::{Error, Result};
use crate::format::header;
use crate::pmem::{points, Space};
use index::{Bound, Entry, Found, Index, Pln};
use leaf::{LeafFormat, Lookup, Slot};

/// Largest key, in bytes.
pub const MAX_KEY: usize = 64 * 1024;
/// Largest value, in bytes.
pub const MAX_VALUE: usize = 16 * 1024 * 1024;

/// DRAM handle of one leaf.
pub struct LeafRef {
    pub off: u64,
    pub size: u64,
    /// Elements known durable: readers scan up to here.
    pub durable: AtomicU64,
    /// Set once the leaf has been replaced; writers that find it retry.
    pub dead: AtomicBool,
    pub lock: Mutex<()>,
}

impl LeafRef {
    pub fn new(off: u64) -> LeafRef {
        LeafRef::with(off, 0, 0)
    }
    pub fn with(off: u64, size: u64, count: u64) -> LeafRef {
        LeafRef {
            off,
            size,
            durable: AtomicU64::new(count),
            dead: AtomicBool::new(false),
            lock: Mutex::new(()),
        }
    }
}

/// Counters of structural work.
#[derive(Default)]
pub struct TreeStats {
    pub splits: AtomicU64,
    pub replaces: AtomicU64,
    pub merges: AtomicU64,
    pub rebuilds: AtomicU64,
    pub rebuild_ns: AtomicU64,
}

/// The tree over a space `S` with leaf format `L`.
pub struct Tree<S: Space, L: LeafFormat> {
    pub space: Arc<S>,
    pub alloc: Arc<Allocator>,
    pub index: ArcSwap<Index>,
    structure: Mutex<()>,
    pub node_size: u64,
    pub keys: AtomicI64,
    pub stats: TreeStats,
    pub path: PathBuf,
    /// Test hook run after a split has published its new leaves and released
    /// its locks, before the splitting operation goes on (crash tests use it
    /// to let another writer act inside that window).
    split_hook: Mutex<Option<SplitHook>>,
    _leaf: PhantomData<L>,
}

/// See [`Tree::set_split_hook`].
pub type SplitHook = Arc<dyn Fn() + Send + Sync>;

/// Where a range starts or stops.
pub type KeyBound = RB<Vec<u8>>;

impl<S: Space, L: LeafFormat> Tree<S, L> {
    pub(crate) fn assemble(
        space: Arc<S>,
        alloc: Arc<Allocator>,
        entries: Vec<Entry>,
        node_size: u64,
        keys: u64,
        path: PathBuf,
    ) -> Self {
        Tree {
            space,
            alloc,
            index: ArcSwap::from_pointee(Index::build(entries, 0)),
            structure: Mutex::new(()),
            node_size,
            keys: AtomicI64::new(keys as i64),
            stats: TreeStats::default(),
            path,
            split_hook: Mutex::new(None),
            _leaf: PhantomData,
        }
    }

    /// Writes the first, empty leaf of a new pool and links it from the header.
    pub(crate) fn create_first_leaf(space: &S, alloc: &Allocator, node_size: u64) -> Result<u64> {
        let off = alloc.alloc(space, node_size)?;
        L::build(space, off, node_size, 0, &[]);
        space.fence(points::NV_NEWLEAF_FENCE);
        header::set_root(space, header::LEAF_HEAD_OFF, off);
        Ok(off)
    }

    pub fn len(&self) -> u64 {
        self.keys.load(Ordering::Relaxed).max(0) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point lookup.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let _g = epoch::pin();
        let idx = self.index.load();
        let f = idx.find(key);
        let leaf = &f.leaf;
        let n = leaf.durable.load(Ordering::Acquire);
        match L::lookup(&*self.space, leaf.off, n, key) {
            Lookup::Present(i) => Some(L::value(&*self.space, leaf.off, i)),
            Lookup::Absent => None,
        }
    }

    /// Inserts or updates. Durable when it returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        check_sizes(key, value)?;
        let blob = match leaf::blob_size(key, value) {
            Some(sz) => {
                let off = self.alloc.alloc(&*self.space, sz)?;
                leaf::write_blob(&*self.space, off, key, value);
                off
            }
            None => 0,
        };
        let new = leaf::encode(key, value, blob);
        loop {
            let guard = epoch::pin();
            let idx = self.index.load();
            let f = idx.find(key);
            let leaf = f.leaf.clone();
            drop(idx);
            let lk = leaf.lock.lock();
            if leaf.dead.load(Ordering::Acquire) {
                continue;
            }
            let n = leaf.durable.load(Ordering::Relaxed);
            let old = match L::lookup(&*self.space, leaf.off, n, key) {
                Lookup::Present(i) => Some(L::element(&*self.space, leaf.off, i)),
                Lookup::Absent => None,
            };
            let need = if old.is_some() { 2 } else { 1 };
            if n + need > L::capacity(leaf.size) {
                drop(lk);
                drop(guard);
                if let Err(e) = self.split(key) {
                    if blob != 0 {
                        self.alloc.free(blob);
                    }
                    return Err(e);
                }
                continue;
            }
            match &old {
                Some(o) => L::append(&*self.space, leaf.off, n, &[leaf::negate(o.words), new]),
                None => L::append(&*self.space, leaf.off, n, &[new]),
            }
            leaf.durable.store(n + need, Ordering::Release);
            drop(lk);
            if old.is_none() {
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
            self.space.op_boundary();
            return Ok(());
        }
    }

    /// Deletes; returns whether the key existed. Durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        if key.len() > MAX_KEY {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                limit: MAX_KEY,
            });
        }
        loop {
            let guard = epoch::pin();
            let f = self.index.load().find(key);
            let leaf = f.leaf;
            let lk = leaf.lock.lock();
            if leaf.dead.load(Ordering::Acquire) {
                continue;
            }
            let n = leaf.durable.load(Ordering::Relaxed);
            // A NEGATIVE element is appended only when a positive one exists (§4.3).
            let Lookup::Present(i) = L::lookup(&*self.space, leaf.off, n, key) else {
                self.space.op_boundary();
                return Ok(false);
            };
            if n + 1 > L::capacity(leaf.size) {
                drop(lk);
                drop(guard);
                self.split(key)?;
                continue;
            }
            let old = L::element(&*self.space, leaf.off, i);
            L::append(&*self.space, leaf.off, n, &[leaf::negate(old.words)]);
            leaf.durable.store(n + 1, Ordering::Release);
            drop(lk);
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.space.op_boundary();
            return Ok(true);
        }
    }

    /// Makes room in the full leaf that `key` routes to: split, replace or
    /// merge with the right sibling (seed 000 §4.4).
    fn split(&self, key: &[u8]) -> Result<()> {
        let structure = self.structure.lock();
        let guard = epoch::pin();
        let idx = self.index.load_full();
        let f = idx.find(key);
        let leaf = f.leaf.clone();
        let lk = leaf.lock.lock();
        let n = leaf.durable.load(Ordering::Relaxed);
        let cap = L::capacity(leaf.size);
        if leaf.dead.load(Ordering::Acquire) || n + 2 <= cap {
            return Ok(()); // someone else made room
        }
        let c = leaf::collate(&*self.space, leaf.off, n);
        let (mut valid, mut dropped_blobs) = (c.valid, c.dropped_blobs);
        let old_next = L::next(&*self.space, leaf.off);
        let min_fill = cap / 2;

        // Right sibling in the same PLN, for a merge.
        let right = idx.successor(f.pln, f.pos).filter(|(p, _, _)| *p == f.pln);
        let mut merged: Option<(Entry, parking_lot::MutexGuard<'_, ()>)> = None;
        let mut new_entries: Vec<(Bound, u64, Vec<Slot>)> = Vec::new();
        let size = self.node_size;
        let mut to_free = vec![leaf.off];

        if valid.len() as u64 >= min_fill {
            // Split: halves (already in key order) to two new leaves.
            let right_half = valid.split_off(valid.len() / 2);
            let sep = Bound::Key(valid.last().expect("non-empty left half").key().into_boxed_slice());
            new_entries.push((sep, 0, valid));
            new_entries.push((f.high.clone(), old_next, right_half));
            self.stats.splits.fetch_add(1, Ordering::Relaxed);
        } else if let Some((_, _, r)) = right
            .as_ref()
            .filter(|(_, _, r)| L::count(&*self.space, r.leaf.off) < L::capacity(r.leaf.size) / 2)
        {
            // Merge with the right sibling into one leaf.
            let rl = r.leaf.lock.lock();
            let rn = r.leaf.durable.load(Ordering::Relaxed);
            let rc = leaf::collate(&*self.space, r.leaf.off, rn);
            valid.extend(rc.valid); // every key of the right sibling is above the left's
            dropped_blobs.extend(rc.dropped_blobs);
            let r_next = L::next(&*self.space, r.leaf.off);
            new_entries.push((r.max.clone(), r_next, valid));
            to_free.push(r.leaf.off);
            merged = Some((r.clone(), rl));
            self.stats.merges.fetch_add(1, Ordering::Relaxed);
        } else {
            // Replace: the valid elements alone in a new leaf.
            new_entries.push((f.high.clone(), old_next, valid));
            self.stats.replaces.fetch_add(1, Ordering::Relaxed);
        }

        // Allocate every new leaf first, so a full pool fails before any change.
        let mut offs = Vec::with_capacity(new_entries.len());
        for _ in &new_entries {
            match self.alloc.alloc(&*self.space, size) {
                Ok(o) => offs.push(o),
                Err(e) => {
                    for o in offs {
                        self.alloc.free(o);
                    }
                    return Err(e);
                }
            }
        }
        // Chain the new leaves: each one's next is the following new leaf.
        for i in 0..new_entries.len() {
            if i + 1 < new_entries.len() {
                new_entries[i].1 = offs[i + 1];
            }
            L::build(&*self.space, offs[i], size, new_entries[i].1, &new_entries[i].2);
        }
        self.space.fence(points::NV_NEWLEAF_FENCE);
        // One atomic store swaps them in.
        let link = match idx.predecessor(f.pln, f.pos) {
            Some(p) => L::next_word(p.leaf.off),
            None => header::LEAF_HEAD_OFF,
        };
        self.space.store(link, offs[0]);
        self.space.flush(link, 8, points::NV_LINK_FLUSH);
        self.space.fence(points::NV_LINK_FENCE);

        // DRAM: new PLN (or a rebuilt index), then retire the old leaves.
        let fresh: Vec<Entry> = new_entries
            .iter()
            .zip(&offs)
            .map(|((max, _, elems), &off)| Entry {
                max: max.clone(),
                leaf: Arc::new(LeafRef::with(off, size, elems.len() as u64)),
            })
            .collect();
        let pln = idx.plns[f.pln].load();
        let remove = if merged.is_some() { 2 } else { 1 };
        let mut entries = pln.entries.clone();
        entries.splice(f.pos..f.pos + remove, fresh);
        if entries.len() <= idx.pln_limit {
            idx.plns[f.pln].store(Arc::new(Pln { entries }));
        } else {
            self.rebuild_from_plns(&idx, f.pln, entries);
        }
        leaf.dead.store(true, Ordering::Release);
        if let Some((r, _)) = &merged {
            r.leaf.dead.store(true, Ordering::Release);
        }
        drop(lk);
        drop(merged);
        // Readers pinned before this point may still scan the old blocks.
        to_free.extend(dropped_blobs);
        debug_assert!(
            {
                let set: BTreeSet<u64> = to_free.iter().copied().collect();
                let kept: BTreeSet<u64> = new_entries
                    .iter()
                    .flat_map(|(_, _, es)| es.iter().map(|e| e.blob()))
                    .collect();
                set.len() == to_free.len() && set.is_disjoint(&kept)
            },
            "split frees a block twice or one still referenced: {to_free:?}"
        );
        self.alloc.retire(&to_free);
        let alloc = self.alloc.clone();
        guard.defer(move || alloc.release(&to_free));
        guard.flush();
        drop(structure);
        let hook = self.split_hook.lock().clone();
        if let Some(h) = hook {
            h();
        }
        self.space.op_boundary();
        Ok(())
    }

    /// Installs (or removes) the split hook. For crash tests only.
    #[doc(hidden)]
    pub fn set_split_hook(&self, hook: Option<SplitHook>) {
        *self.split_hook.lock() = hook;
    }

    /// Rebuild-from-PLN (seed 000 §4.5): a PLN overflowed; lay every entry
    /// out in a new index. Searches keep using the old one until the swap.
    fn rebuild_from_plns(&self, idx: &Index, changed: usize, changed_entries: Vec<Entry>) {
        let t = Instant::now();
        let mut all = Vec::with_capacity(idx.leaf_count() + 1);
        for (p, pln) in idx.plns[..idx.used_plns].iter().enumerate() {
            if p == changed {
                all.extend(changed_entries.iter().cloned());
            } else {
                all.extend(pln.load().entries.iter().cloned());
            }
        }
        self.index.store(Arc::new(Index::build(all, idx.generation + 1)));
        self.stats.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rebuild_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The live elements of one leaf within the range, in key order. Values
    /// that live in blobs are read now, while the epoch is pinned; inline
    /// keys and values are materialised only when the iterator yields them.
    fn leaf_range(&self, f: &Found, lo: &KeyBound, hi: &KeyBound) -> Vec<Pending> {
        let n = f.leaf.durable.load(Ordering::Acquire);
        leaf::collate(&*self.space, f.leaf.off, n)
            .valid
            .into_iter()
            .filter(|e| slot_in_range(e, lo, hi))
            .map(|e| {
                let blob_value = e.value_in_blob().then(|| leaf::element_value(&*self.space, &e.words));
                Pending { slot: e, blob_value }
            })
            .collect()
    }

    /// Iterator over `[lo, hi]` in key order (or reverse), reading one leaf at a time.
    pub fn range(self: &Arc<Self>, lo: KeyBound, hi: KeyBound, reverse: bool) -> RangeIter<S, L> {
        RangeIter {
            tree: self.clone(),
            lo,
            hi,
            reverse,
            buf: Vec::new(),
            done: false,
        }
    }

    /// Every leaf offset in chain order, with its element count.
    pub fn leaf_offsets(&self) -> Vec<(u64, u64)> {
        self.index
            .load()
            .entries()
            .iter()
            .map(|e| (e.leaf.off, e.leaf.durable.load(Ordering::Acquire)))
            .collect()
    }
}

fn check_sizes(key: &[u8], value: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            limit: MAX_KEY,
        });
    }
    if value.len() > MAX_VALUE {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            limit: MAX_VALUE,
        });
    }
    Ok(())
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

fn slot_in_range(e: &Slot, lo: &KeyBound, hi: &KeyBound) -> bool {
    use std::cmp::Ordering::*;
    let above = match lo {
        RB::Unbounded => true,
        RB::Included(l) => e.cmp_bytes(l) != Less,
        RB::Excluded(l) => e.cmp_bytes(l) == Greater,
    };
    above
        && match hi {
            RB::Unbounded => true,
            RB::Included(h) => e.cmp_bytes(h) != Greater,
            RB::Excluded(h) => e.cmp_bytes(h) == Less,
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
    lo: KeyBound,
    hi: KeyBound,
    reverse: bool,
    /// Pending elements, in reverse of the order they are yielded.
    buf: Vec<Pending>,
    done: bool,
}

impl<S: Space, L: LeafFormat> RangeIter<S, L> {
    fn refill(&mut self) {
        while self.buf.is_empty() && !self.done {
            if let (RB::Included(l) | RB::Excluded(l), RB::Included(h) | RB::Excluded(h)) = (&self.lo, &self.hi) {
                if l > h || (l == h && (matches!(self.lo, RB::Excluded(_)) || matches!(self.hi, RB::Excluded(_)))) {
                    self.done = true;
                    return;
                }
            }
            let _g = epoch::pin();
            let idx = self.tree.index.load();
            let f = if self.reverse {
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
            };
            let mut pairs = self.tree.leaf_range(&f, &self.lo, &self.hi);
            if self.reverse {
                // buf pops from the end: keep ascending so the largest comes first.
                self.buf = pairs;
                match f.low {
                    Bound::NegInf => self.done = true,
                    Bound::Key(k) => self.hi = RB::Included(k.into_vec()),
                    Bound::PosInf => self.done = true,
                }
            } else {
                pairs.reverse();
                self.buf = pairs;
                match f.high {
                    Bound::PosInf => self.done = true,
                    Bound::Key(k) => self.lo = RB::Excluded(k.into_vec()),
                    Bound::NegInf => {}
                }
            }
        }
    }
}

impl<S: Space, L: LeafFormat> Iterator for RangeIter<S, L> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        self.refill();
        self.buf.pop().map(Pending::into_pair)
    }
}
