//! Inner nodes in DRAM (NV-Tree §4.1–4.2, §4.5).
//!
//! Inner nodes (INs) form NV-Tree's pointerless array: node `i`'s children
//! are nodes `i*F + 1 + pos` with fan-out `F = 2m + 1`, all in one vector,
//! laid out level by level. The last level are the PLNs (parents of leaves),
//! which hold `(max key, leaf)` entries. INs never change between rebuilds;
//! a PLN changes by copy-on-write when a split or merge inside its range
//! adds or removes entries, and a PLN that would overflow triggers a rebuild
//! of the whole index (rebuild-from-PLN). Searches keep using the old index
//! while a new one is built, and publishing a new index or PLN is one
//! pointer swap, so readers take no locks.
//!
//! Routing follows the paper: an entry's key is the largest key its leaf
//! may hold, and a key goes to the first entry whose bound is >= the key;
//! the last entry's bound is +inf. A leaf with no elements at the start of the
//! chain gets -inf (it covers nothing), one elsewhere repeats its
//! predecessor's bound (likewise empty).

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use crossbeam_epoch as epoch;
use smallvec::SmallVec;

use super::swap::Swap;
use super::LeafRef;

/// Keys a PLN holds (`m` in the paper) and the IN fan-out `2m + 1`.
pub const PLN_CAPACITY: usize = 32;
pub const FANOUT: usize = 2 * PLN_CAPACITY + 1;
/// Entries per PLN right after a rebuild. The paper stores exactly one, to
/// delay the next rebuild as long as possible, at the price of an index
/// 2m+1 times wider than the leaves need; with 4 of 32 the tree grows about
/// eightfold (less the variance of where splits land) between rebuilds.
pub const PLN_FILL: usize = 4;

/// A separator: the largest key a leaf may hold.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bound {
    NegInf,
    Key(SepKey),
    PosInf,
}

/// A separator's key bytes: up to [`SepKey::INLINE`] bytes in place, a
/// longer key shared. A split copies its PLN's bounds and a rebuild every
/// bound; a shared key's clone is an atomic add on its count, on a line
/// no other work of the split touches (a cache miss each, about a tenth
/// of a split of 1M keys when every bound was shared). An inline key's
/// clone copies 24 bytes.
#[derive(Clone)]
pub enum SepKey {
    Inline { len: u8, bytes: [u8; SepKey::INLINE] },
    Shared(Arc<[u8]>),
}

impl SepKey {
    /// Longest key kept in place.
    pub const INLINE: usize = 22;
}

impl From<&[u8]> for SepKey {
    fn from(k: &[u8]) -> Self {
        if k.len() <= SepKey::INLINE {
            let mut bytes = [0; SepKey::INLINE];
            bytes[..k.len()].copy_from_slice(k);
            SepKey::Inline {
                len: k.len() as u8,
                bytes,
            }
        } else {
            SepKey::Shared(k.into())
        }
    }
}

impl From<Vec<u8>> for SepKey {
    fn from(k: Vec<u8>) -> Self {
        SepKey::from(&k[..])
    }
}

impl std::ops::Deref for SepKey {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            SepKey::Inline { len, bytes } => &bytes[..*len as usize],
            SepKey::Shared(k) => k,
        }
    }
}

impl AsRef<[u8]> for SepKey {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for SepKey {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SepKey {}

impl PartialOrd for SepKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SepKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (**self).cmp(&**other)
    }
}

impl std::fmt::Debug for SepKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl Bound {
    /// `self >= key`
    #[inline]
    pub fn covers(&self, key: &[u8]) -> bool {
        match self {
            Bound::NegInf => false,
            Bound::PosInf => true,
            Bound::Key(b) => b.as_ref() >= key,
        }
    }

    /// Order of the bound relative to a key.
    #[inline]
    pub fn cmp_key(&self, key: &[u8]) -> Ordering {
        match self {
            Bound::NegInf => Ordering::Less,
            Bound::PosInf => Ordering::Greater,
            Bound::Key(b) => b.as_ref().cmp(key),
        }
    }
}

/// One leaf as its parent sees it (`St`: the leaf format's DRAM state).
pub struct Entry<St> {
    pub max: Bound,
    pub leaf: Arc<LeafRef<St>>,
}

impl<St> Clone for Entry<St> {
    fn clone(&self) -> Self {
        Entry {
            max: self.max.clone(),
            leaf: self.leaf.clone(),
        }
    }
}

/// Slots kept inside the PLN's own allocation, so routing reads the PLN's
/// words and leaf handle without following a pointer to a spilled array:
/// twice the [`PLN_FILL`] a rebuild leaves, so a PLN stays inline until
/// its leaves have split as often again. Not more: the PLNs of a large
/// tree are read in random order and are rarely all in cache, so their
/// size is what a point operation pays in misses. With 32 inline slots a
/// PLN took 832 bytes, most of it empty, and the 8 234 PLNs of 1M keys
/// 6.9 MB; with 8 it takes 256 bytes (searches of 1M keys about a tenth
/// faster, inserts too, since a split copies its PLN).
const INLINE_SLOTS: usize = 2 * PLN_FILL;

/// A parent of leaves: immutable, replaced whole.
pub struct Pln<St> {
    /// The entries' bounds as prefix words, side by side so routing counts
    /// them in one pass; it reads a full key (a pointer away) only on a tie.
    words: SmallVec<[u64; INLINE_SLOTS]>,
    /// The entries' leaves, in the same order: what routing hands on.
    leaves: SmallVec<[Slot<St>; INLINE_SLOTS]>,
    /// The entries' bounds, in the same order (an entry is a bound and
    /// its slot's leaf: one reference to each leaf, so a copy of the PLN
    /// touches each leaf's count once).
    maxes: Box<[Bound]>,
    /// Entries it may hold before the index is rebuilt: the index's
    /// `pln_limit`, more for a hot-write PLN (NV-Tree §5.5).
    pub limit: usize,
    /// The prefix word of the bound below its first entry (the inner
    /// separator that routes here; 0 for the first PLN): the lower bound
    /// a lookup in its first leaf interpolates from. Splits and merges
    /// inside a PLN keep its last bound, so this holds for the index's
    /// life.
    low: u64,
}

/// A leaf as its PLN routes to it: the handle, and the leaf format's
/// guide ([`LeafFormat::guide`](super::leaf::LeafFormat::guide)), learned by
/// the first lookup that reads the leaf, on the same line as the handle.
struct Slot<St> {
    leaf: Arc<LeafRef<St>>,
    guide: AtomicU64,
}

impl<St> Slot<St> {
    fn new(leaf: Arc<LeafRef<St>>, guide: u64) -> Self {
        Slot {
            leaf,
            guide: AtomicU64::new(guide),
        }
    }
}

/// Asks for the line `p` points to, to be written soon: the reference
/// counts a PLN copy or drop updates sit on lines of their own (one per
/// leaf handle), and asking for all of them first overlaps their misses.
#[inline]
fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing architecturally and
    // cannot fault, whatever the address.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl<St> Drop for Pln<St> {
    /// Overlaps the misses of the reference counts its fields' drops
    /// release (a split's old PLN is dropped by the epoch collector, long
    /// after the split read it).
    fn drop(&mut self) {
        self.prefetch_leaves();
    }
}

impl<St> Pln<St> {
    fn new(entries: Vec<Entry<St>>, limit: usize, low: u64) -> Self {
        let words = entries.iter().map(|e| bound_word(&e.max)).collect();
        let (maxes, leaves): (Vec<Bound>, SmallVec<[Slot<St>; INLINE_SLOTS]>) =
            entries.into_iter().map(|e| (e.max, Slot::new(e.leaf, 0))).unzip();
        Pln {
            words,
            leaves,
            maxes: maxes.into_boxed_slice(),
            limit,
            low,
        }
    }

    /// The PLN that replaces `self` after a split or merge inside it: its
    /// entries with the `remove` from `pos` on replaced by `fresh`. The
    /// kept leaves keep the guides `self` learned (a leaf's guide never
    /// changes: a rewrite makes a new leaf; one kept in `fresh`, as a
    /// split in place keeps its left part, keeps its guide too).
    pub fn spliced(&self, pos: usize, remove: usize, fresh: Vec<Entry<St>>) -> Self {
        let n = self.len() - remove + fresh.len();
        self.prefetch_leaves();
        let removed = &self.leaves[pos..pos + remove];
        let kept = |r: std::ops::Range<usize>| {
            self.leaves[r]
                .iter()
                .map(|s| Slot::new(s.leaf.clone(), s.guide.load(AtomicOrdering::Relaxed)))
        };
        let mut words = SmallVec::with_capacity(n);
        let mut leaves = SmallVec::with_capacity(n);
        let mut maxes = Vec::with_capacity(n);
        words.extend_from_slice(&self.words[..pos]);
        leaves.extend(kept(0..pos));
        maxes.extend_from_slice(&self.maxes[..pos]);
        for e in fresh {
            let guide = removed
                .iter()
                .find(|o| Arc::ptr_eq(&o.leaf, &e.leaf))
                .map_or(0, |o| o.guide.load(AtomicOrdering::Relaxed));
            words.push(bound_word(&e.max));
            leaves.push(Slot::new(e.leaf, guide));
            maxes.push(e.max);
        }
        words.extend_from_slice(&self.words[pos + remove..]);
        leaves.extend(kept(pos + remove..self.len()));
        maxes.extend_from_slice(&self.maxes[pos + remove..]);
        Pln {
            words,
            leaves,
            maxes: maxes.into_boxed_slice(),
            limit: self.limit,
            low: self.low,
        }
    }

    /// How many entries it holds.
    #[inline]
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// Entry `i`'s bound.
    pub fn max(&self, i: usize) -> &Bound {
        &self.maxes[i]
    }

    /// Entry `i`'s leaf.
    pub fn leaf(&self, i: usize) -> &Arc<LeafRef<St>> {
        &self.leaves[i].leaf
    }

    /// Entry `i`, copied.
    pub fn entry(&self, i: usize) -> Entry<St> {
        Entry {
            max: self.maxes[i].clone(),
            leaf: self.leaves[i].leaf.clone(),
        }
    }

    /// Its entries in order, copied.
    pub fn entries(&self) -> impl Iterator<Item = Entry<St>> + '_ {
        self.prefetch_leaves();
        (0..self.len()).map(|i| self.entry(i))
    }

    /// Asks for every leaf handle's first line (its reference count)
    /// before a copy or drop updates the counts one by one.
    fn prefetch_leaves(&self) {
        for s in self.leaves.iter() {
            prefetch_write(Arc::as_ptr(&s.leaf));
        }
    }

    /// The guides of its leaves, in entry order (0 where none is known).
    pub fn guides(&self) -> impl Iterator<Item = u64> + '_ {
        self.leaves.iter().map(|s| s.guide.load(AtomicOrdering::Relaxed))
    }

    /// The first entry whose bound is >= key (> key when `strict`).
    #[inline]
    fn position(&self, key: &[u8], kw: u64, strict: bool) -> usize {
        first_covering(&self.words, kw, strict, |i| self.maxes[i].cmp_key(key))
    }
}

/// The first of the `words.len()` bounds whose prefix words `words` are in
/// order that is >= the key whose prefix word is `kw` (> with `strict`);
/// `full(i)` orders bound `i` against the whole key, asked only on a tie.
///
/// Halvings narrow a long run (a PLN grown past its build size) to at
/// most [`COUNT_RUN`] words, which are then counted rather than searched:
/// the loads of a run's lines are independent, so they are in flight at
/// once (one cache miss's latency instead of one per halving), the
/// compares carry no unpredictable branches, and the count vectorises.
#[inline]
fn first_covering(words: &[u64], kw: u64, strict: bool, full: impl Fn(usize) -> Ordering) -> usize {
    let (mut lo, mut hi) = (0, words.len());
    while hi - lo > COUNT_RUN {
        let mid = (lo + hi) / 2;
        match words[mid].cmp(&kw) {
            Ordering::Less => lo = mid + 1,
            Ordering::Greater => hi = mid + 1,
            // A tie may sit on either side of the key: count from here.
            Ordering::Equal => break,
        }
    }
    let mut i = lo + words[lo..hi].iter().filter(|&&w| w < kw).count();
    // Bounds sharing the key's word are ordered by their whole keys.
    while i < words.len() && words[i] == kw {
        match full(i) {
            Ordering::Less => i += 1,
            Ordering::Equal if strict => i += 1,
            _ => break,
        }
    }
    i
}

/// Words [`first_covering`] counts in one pass: an IN node's keys, eight
/// lines.
const COUNT_RUN: usize = FANOUT - 1;

/// A leaf found by routing, with the range of keys it covers.
pub struct Found<St> {
    pub leaf: Arc<LeafRef<St>>,
    /// Exclusive lower bound (the previous entry's max).
    pub low: Bound,
    /// Inclusive upper bound.
    pub high: Bound,
    pub pln: usize,
    pub pos: usize,
}

impl<St> Clone for Found<St> {
    fn clone(&self) -> Self {
        Found {
            leaf: self.leaf.clone(),
            low: self.low.clone(),
            high: self.high.clone(),
            pln: self.pln,
            pos: self.pos,
        }
    }
}

/// One IN node's keys as order-preserving 8-byte prefixes, cache-line
/// aligned: a search compares words and reads a full key only on a tie.
#[repr(align(64))]
#[derive(Clone)]
struct NodeWords([u64; FANOUT - 1]);

/// Order-preserving prefix word of a bound (ties are resolved on full keys).
fn bound_word(b: &Bound) -> u64 {
    match b {
        Bound::NegInf => 0,
        Bound::Key(k) => crate::format::leaf_nv::key_word(k),
        Bound::PosInf => u64::MAX,
    }
}

/// The whole inner structure of one tree generation.
pub struct Index<St> {
    /// IN keys, `FANOUT - 1` per node, nodes in level order.
    keys: Vec<Bound>,
    /// The same keys' prefix words, one aligned block per IN node.
    words: Vec<NodeWords>,
    /// Number of IN nodes (PLN ids start here).
    inner_nodes: usize,
    pub plns: Vec<Swap<Pln<St>>>,
    /// How many PLNs carry entries (the rest pad the complete tree).
    pub used_plns: usize,
    pub generation: u64,
    /// Entries a PLN may hold before the index is rebuilt (see `pln_limit`).
    pub pln_limit: usize,
    /// PLNs given a larger limit as hot-write at this build.
    pub hot_plns: usize,
    /// Leaves this index was built over: see [`Index::outgrown`].
    built_leaves: usize,
}

/// When a PLN overflows. The paper's PLNs have a fixed size, so a write
/// hot spot (ascending inserts all land in the last PLN) forces a rebuild of
/// the whole index every few splits: quadratic. Our PLNs are vectors, so a
/// PLN may grow with the tree: up to an eighth of the leaves it was built
/// over, between `PLN_CAPACITY` and `PLN_MAX` (a split copies its PLN, so
/// the copy must stay short). This is the idea of NV-Tree §5.5's hot-PLN
/// enlargement without sizes to tune.
pub fn pln_limit(leaves: usize) -> usize {
    (leaves / 8).clamp(PLN_CAPACITY, PLN_MAX)
}

/// Largest PLN a hot spot may grow before the index is rebuilt.
pub const PLN_MAX: usize = 256;

impl<St> Index<St> {
    /// Builds an index over `entries` (in key order; the last bound is
    /// +inf), `PLN_FILL` entries per PLN: the rebuild of NV-Tree §4.5.
    pub fn build(entries: Vec<Entry<St>>, generation: u64) -> Self {
        Index::build_adaptive(entries, generation, false)
    }

    /// [`Index::build`]; with `hot`, a PLN whose leaves were written more
    /// than the average PLN's (their DRAM counters, NV-Tree §5.5) gets a
    /// larger limit, so the write hot spot delays the next rebuild.
    pub fn build_adaptive(entries: Vec<Entry<St>>, generation: u64, hot: bool) -> Self {
        assert!(!entries.is_empty(), "a tree always has a leaf");
        let n_entries = entries.len();
        let used = entries.len().div_ceil(PLN_FILL);
        // Depth: smallest d with FANOUT^d >= used. Node ids follow the
        // complete FANOUT-ary layout (children of i at i*F+1+pos), but only
        // real nodes are built: the real nodes of a level are its first ids,
        // and a search never enters padding (padding keys are +inf and the
        // last real subtree's bound is +inf).
        let mut widths = vec![1usize];
        while *widths.last().unwrap() < used {
            let w = widths.last().unwrap() * FANOUT;
            widths.push(w);
        }
        let depth = widths.len() - 1; // inner levels
        let inner_nodes: usize = widths[..depth].iter().sum();
        let mut plns: Vec<Swap<Pln<St>>> = Vec::with_capacity(used);
        let mut bounds: Vec<Bound> = Vec::with_capacity(used);
        let limit = pln_limit(n_entries);
        let writes = |es: &[Entry<St>]| -> u64 { es.iter().map(|e| e.leaf.counters.get().writes).sum() };
        let total = if hot { writes(&entries) } else { 0 };
        let mut hot_plns = 0;
        let mut it = entries.into_iter().peekable();
        let mut low = 0;
        for _ in 0..used {
            let chunk: Vec<Entry<St>> = it.by_ref().take(PLN_FILL).collect();
            let last = it.peek().is_none();
            bounds.push(if last {
                Bound::PosInf
            } else {
                chunk.last().unwrap().max.clone()
            });
            let extra = if hot {
                super::adaptive::hot_pln_extra(writes(&chunk), total, used, PLN_CAPACITY)
            } else {
                0
            };
            hot_plns += (extra > 0) as usize;
            let next_low = bound_word(&chunk.last().unwrap().max);
            plns.push(Swap::from_pointee(Pln::new(chunk, limit + extra, low)));
            low = next_low;
        }
        // Real node counts per level, bottom-up.
        let mut counts = vec![0usize; depth + 1];
        counts[depth] = used;
        for k in (0..depth).rev() {
            counts[k] = counts[k + 1].div_ceil(FANOUT);
        }
        let level_start = |k: usize| -> usize { widths[..k].iter().sum() };
        let real_ids = if depth == 0 {
            0
        } else {
            level_start(depth - 1) + counts[depth - 1]
        };
        let mut keys = vec![Bound::PosInf; real_ids * (FANOUT - 1)];
        let mut level_bounds = bounds;
        for k in (0..depth).rev() {
            let below = level_bounds.len();
            let mut parent_bounds = Vec::with_capacity(counts[k]);
            for j in 0..counts[k] {
                let node = level_start(k) + j;
                for c in 0..FANOUT - 1 {
                    let child = j * FANOUT + c;
                    if child < below {
                        keys[node * (FANOUT - 1) + c] = level_bounds[child].clone();
                    }
                }
                // A subtree's bound is its last real child's bound.
                parent_bounds.push(level_bounds[(j * FANOUT + FANOUT - 1).min(below - 1)].clone());
            }
            level_bounds = parent_bounds;
        }
        let words = keys
            .chunks(FANOUT - 1)
            .map(|ks| {
                let mut w = [0u64; FANOUT - 1];
                for (d, k) in w.iter_mut().zip(ks) {
                    *d = bound_word(k);
                }
                NodeWords(w)
            })
            .collect();
        Index {
            keys,
            words,
            inner_nodes,
            plns,
            used_plns: used,
            generation,
            pln_limit: limit,
            hot_plns,
            built_leaves: n_entries,
        }
    }

    /// Whether an index holding `leaves` leaves has grown half again past
    /// the leaves it was built over, and should be rebuilt. A rebuild lays
    /// the leaves out [`PLN_FILL`] to a PLN; without it, random inserts
    /// would grow every PLN towards its limit (up to [`PLN_MAX`]) as the
    /// tree grows: each split copies its whole PLN (a reference count
    /// update per entry, and a key copy), and a PLN past its inline
    /// capacity reads its words and slots from two more allocations per
    /// lookup. Rebuilding at each growth by half costs every leaf about
    /// three copies over the tree's life.
    pub fn outgrown(&self, leaves: u64) -> bool {
        2 * leaves > 3 * self.built_leaves.max(PLN_FILL) as u64
    }

    /// Gives the slots, in entry order, the guides `guides` yields (a
    /// rebuilt index keeps what the old one learned; 0 leaves a slot to
    /// learn its own).
    pub fn seed_guides(&self, mut guides: impl Iterator<Item = u64>) {
        for p in &self.plns[..self.used_plns] {
            for slot in &p.load().leaves {
                match guides.next() {
                    Some(g) => slot.guide.store(g, AtomicOrdering::Relaxed),
                    None => return,
                }
            }
        }
    }

    /// Algorithm 1 (FINDLEAF): descend the pointerless INs to a PLN id.
    /// With `strict`, route to the first bound > key instead of >= key.
    #[inline]
    pub fn find_pln(&self, key: &[u8], strict: bool) -> usize {
        self.find_pln_word(key, crate::format::leaf_nv::key_word(key), strict)
    }

    /// [`Index::find_pln`] with the key's prefix word `kw` already known.
    #[inline]
    fn find_pln_word(&self, key: &[u8], kw: u64, strict: bool) -> usize {
        let mut id = 0usize;
        while id < self.inner_nodes {
            let keys = &self.keys[id * (FANOUT - 1)..];
            let words = &self.words[id].0;
            let lo = first_covering(words, kw, strict, |i| keys[i].cmp_key(key));
            id = id * FANOUT + 1 + lo;
        }
        id - self.inner_nodes
    }

    /// Routes `key` to its leaf: the first entry whose bound is >= key.
    pub fn find(&self, key: &[u8]) -> Found<St> {
        self.route(key, false)
    }

    /// The leaf `key` routes to, without the bounds [`Index::find`] copies
    /// (the point operations' path: two key copies fewer per operation).
    pub fn find_leaf(&self, key: &[u8]) -> Arc<LeafRef<St>> {
        self.with_leaf(key, Arc::clone)
    }

    /// Runs `f` on the leaf `key` routes to, borrowed from its PLN: a
    /// reader that is done with the leaf before the PLN guard drops skips
    /// the two atomic read-modify-writes of the handle's reference count
    /// a clone and its drop cost (and the stall on that line).
    #[inline]
    pub fn with_leaf<R>(&self, key: &[u8], f: impl FnOnce(&Arc<LeafRef<St>>) -> R) -> R {
        self.with_leaf_guided(&epoch::pin(), key, |_, _, _, _| {}, |leaf, _| f(leaf))
    }

    /// [`Index::with_leaf`] for a reader that prefetches: before `f` runs,
    /// `guess(guide, lo, hi, kw)` is called with the leaf's guide (when one
    /// is known), the prefix words of the leaf's bounds and the key's
    /// word. `f` also gets the guide's cell, to fill in when it is 0.
    /// The PLN is read under `pin` (no reference count is touched).
    #[inline]
    pub fn with_leaf_guided<R>(
        &self,
        pin: &epoch::Guard,
        key: &[u8],
        guess: impl FnOnce(u64, u64, u64, u64),
        f: impl FnOnce(&Arc<LeafRef<St>>, Option<&AtomicU64>) -> R,
    ) -> R {
        let kw = crate::format::leaf_nv::key_word(key);
        let mut p = self.find_pln_word(key, kw, false).min(self.used_plns - 1);
        loop {
            let pln = self.plns[p].get(pin);
            let pos = pln.position(key, kw, false);
            if let Some(slot) = pln.leaves.get(pos) {
                let guide = slot.guide.load(AtomicOrdering::Relaxed);
                if guide != 0 {
                    let lo = if pos > 0 { pln.words[pos - 1] } else { pln.low };
                    guess(guide, lo, pln.words[pos], kw);
                }
                return f(&slot.leaf, Some(&slot.guide));
            }
            if p + 1 >= self.used_plns {
                return f(&self.find_last().leaf, None);
            }
            p += 1;
        }
    }

    /// The first leaf whose bound is > key: where keys just above `key` live.
    pub fn find_gt(&self, key: &[u8]) -> Found<St> {
        self.route(key, true)
    }

    /// The last leaf.
    pub fn find_last(&self) -> Found<St> {
        let (p, pos) = self.last_entry(self.used_plns - 1);
        let pln = self.plns[p].load();
        self.found_at(p, pos, &pln)
    }

    fn route(&self, key: &[u8], strict: bool) -> Found<St> {
        let kw = crate::format::leaf_nv::key_word(key);
        let mut p = self.find_pln_word(key, kw, strict).min(self.used_plns - 1);
        let pin = epoch::pin();
        loop {
            let pln = self.plns[p].get(&pin);
            let pos = pln.position(key, kw, strict);
            if pos < pln.len() {
                return self.found_at(p, pos, pln);
            }
            if p + 1 >= self.used_plns {
                return self.find_last();
            }
            p += 1;
        }
    }

    fn last_entry(&self, mut p: usize) -> (usize, usize) {
        loop {
            let n = self.plns[p].load().len();
            if n > 0 {
                return (p, n - 1);
            }
            p -= 1;
        }
    }

    fn found_at(&self, p: usize, pos: usize, pln: &Pln<St>) -> Found<St> {
        let low = if pos > 0 {
            pln.max(pos - 1).clone()
        } else {
            self.prev_bound(p)
        };
        Found {
            leaf: pln.leaf(pos).clone(),
            low,
            high: pln.max(pos).clone(),
            pln: p,
            pos,
        }
    }

    /// Bound of the last entry before PLN `p` (or -inf).
    fn prev_bound(&self, p: usize) -> Bound {
        self.with_before(p, 0, |pln, i| pln.max(i).clone())
            .unwrap_or(Bound::NegInf)
    }

    /// The entry before (`pln`, `pos`) in key order.
    pub fn predecessor(&self, pln: usize, pos: usize) -> Option<Entry<St>> {
        self.with_before(pln, pos, |p, i| p.entry(i))
    }

    /// The offset of the leaf before (`pln`, `pos`) in key order: what
    /// [`Index::predecessor`] gives a caller that needs no more, without
    /// updating the handle's reference count.
    pub fn predecessor_off(&self, pln: usize, pos: usize) -> Option<u64> {
        self.with_before(pln, pos, |p, i| p.leaf(i).off)
    }

    /// `f` of the PLN and position of the entry before (`pln`, `pos`) in
    /// key order, read under a pin (no reference count is touched).
    fn with_before<R>(&self, pln: usize, pos: usize, f: impl FnOnce(&Pln<St>, usize) -> R) -> Option<R> {
        let pin = epoch::pin();
        if pos > 0 {
            return Some(f(self.plns[pln].get(&pin), pos - 1));
        }
        let (p, last) = (0..pln).rev().find_map(|q| {
            let p = self.plns[q].get(&pin);
            p.len().checked_sub(1).map(|last| (p, last))
        })?;
        Some(f(p, last))
    }

    /// The entry after (`pln`, `pos`) in key order.
    pub fn successor(&self, pln: usize, pos: usize) -> Option<(usize, usize, Entry<St>)> {
        let here = self.plns[pln].load();
        if pos + 1 < here.len() {
            return Some((pln, pos + 1, here.entry(pos + 1)));
        }
        (pln + 1..self.used_plns).find_map(|q| {
            let p = self.plns[q].load();
            (!p.is_empty()).then(|| (q, 0, p.entry(0)))
        })
    }

    /// Every entry in key order.
    pub fn entries(&self) -> Vec<Entry<St>> {
        let mut v = Vec::new();
        for p in &self.plns[..self.used_plns] {
            v.extend(p.load().entries());
        }
        v
    }

    pub fn leaf_count(&self) -> usize {
        self.plns[..self.used_plns].iter().map(|p| p.load().len()).sum()
    }

    /// Bytes of DRAM the inner structure takes (approximate).
    pub fn inner_node_count(&self) -> usize {
        self.inner_nodes + self.plns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize) -> Vec<Entry<()>> {
        (0..n)
            .map(|i| Entry {
                max: if i + 1 == n {
                    Bound::PosInf
                } else {
                    Bound::Key(format!("k{:05}", i * 10 + 9).into_bytes().into())
                },
                leaf: Arc::new(LeafRef::new(1000 + i as u64)),
            })
            .collect()
    }

    #[test]
    fn separator_keys_order_alike_inline_or_shared() {
        // Keys on both sides of the inline limit, sharing prefixes.
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for len in [0, 1, 8, SepKey::INLINE - 1, SepKey::INLINE, SepKey::INLINE + 1, 40] {
            for fill in [b'a', b'b'] {
                keys.push(vec![fill; len]);
            }
        }
        for a in &keys {
            let ka = SepKey::from(&a[..]);
            assert_eq!(&*ka, &a[..]);
            assert_eq!(matches!(ka, SepKey::Inline { .. }), a.len() <= SepKey::INLINE);
            for b in &keys {
                let (ba, bb) = (Bound::Key(ka.clone()), Bound::Key(b.clone().into()));
                assert_eq!(ba.cmp(&bb), a.cmp(b), "{a:?} {b:?}");
                assert_eq!(ba == bb, a == b);
                assert_eq!(ba.covers(b), a >= b);
            }
            assert!(Bound::NegInf < Bound::Key(ka.clone()) && Bound::Key(ka) < Bound::PosInf);
        }
        // No larger than the shared form was: a bound stays three words.
        assert_eq!(std::mem::size_of::<Bound>(), 24);
    }

    #[test]
    fn a_spliced_pln_keeps_the_guides_of_the_leaves_it_keeps() {
        let es = entries(6);
        let pln = Pln::new(es.clone(), 32, 7);
        for (i, s) in pln.leaves.iter().enumerate() {
            s.guide.store(100 + i as u64, AtomicOrdering::Relaxed);
        }
        // Leaf 2 split into two new leaves; leaf 3 replaced by itself (a
        // split in place keeps its left part).
        let new = |off: u64, max: &str| Entry {
            max: Bound::Key(max.as_bytes().into()),
            leaf: Arc::new(LeafRef::new(off)),
        };
        let fresh = vec![new(5000, "k00024"), new(5001, "k00029"), es[3].clone()];
        let spliced = pln.spliced(2, 2, fresh);
        let offs: Vec<u64> = spliced.entries().map(|e| e.leaf.off).collect();
        assert_eq!(offs, [1000, 1001, 5000, 5001, 1003, 1004, 1005]);
        let guides: Vec<u64> = spliced.guides().collect();
        assert_eq!(guides, [100, 101, 0, 0, 103, 104, 105]);
        let maxes: Vec<Bound> = spliced.entries().map(|e| e.max).collect();
        let words: Vec<u64> = maxes.iter().map(bound_word).collect();
        assert_eq!(&spliced.words[..], &words[..]);
        assert!(maxes.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((spliced.limit, spliced.low, spliced.len()), (32, 7, 7));
        // Each leaf is referenced once per PLN that holds it.
        assert_eq!(Arc::strong_count(&es[0].leaf), 3);
        drop((pln, spliced));
        assert_eq!(Arc::strong_count(&es[0].leaf), 1);
    }

    #[test]
    fn first_covering_matches_a_linear_scan_with_ties() {
        // Bounds as (word, rest of the key) in order, many sharing a word.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for n in [0usize, 1, 2, 3, 7, 31, 64, 65, 200, 300] {
            for _ in 0..50 {
                let mut b: Vec<(u64, u64)> = (0..n).map(|_| (rnd(6) * 10, rnd(5))).collect();
                b.sort_unstable();
                let words: Vec<u64> = b.iter().map(|e| e.0).collect();
                for kw in 0..62 {
                    for rest in 0..6 {
                        for strict in [false, true] {
                            let got = first_covering(&words, kw, strict, |i| b[i].1.cmp(&rest));
                            let want = b
                                .iter()
                                .position(|&e| if strict { e > (kw, rest) } else { e >= (kw, rest) })
                                .unwrap_or(n);
                            assert_eq!(got, want, "{b:?} key ({kw}, {rest}) strict {strict}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn routes_every_key_to_the_covering_leaf() {
        for n in [1, 2, 11, 12, 13, 100, 500, 5000] {
            let idx = Index::build(entries(n), 0);
            assert_eq!(idx.leaf_count(), n);
            for p in 0..idx.used_plns {
                for pos in 0..idx.plns[p].load().len() {
                    let want = idx.predecessor(p, pos).map(|e| e.leaf.off);
                    assert_eq!(idx.predecessor_off(p, pos), want, "n={n} pln {p} pos {pos}");
                }
            }
            for i in 0..n * 10 + 20 {
                let key = format!("k{i:05}").into_bytes();
                let f = idx.find(&key);
                assert!(Arc::ptr_eq(&f.leaf, &idx.find_leaf(&key)));
                let want = (i / 10).min(n - 1);
                assert_eq!(f.leaf.off, 1000 + want as u64, "n={n} key={i}");
                assert!(f.high.covers(&key));
                assert!(!f.low.covers(&key));
                let g = idx.find_gt(&key);
                assert!(g.high.cmp_key(&key) == Ordering::Greater);
            }
            assert_eq!(idx.find(b"").leaf.off, 1000);
        }
    }

    #[test]
    fn routes_long_keys_sharing_a_prefix_word() {
        // Every bound has the same first 8 bytes: the word ties and full keys decide.
        let n = 3000;
        let k = |i: usize| format!("samepref{i:06}").into_bytes();
        let es: Vec<Entry<()>> = (0..n)
            .map(|i| Entry {
                max: if i + 1 == n {
                    Bound::PosInf
                } else {
                    Bound::Key(k(i * 2 + 1).into())
                },
                leaf: Arc::new(LeafRef::new(i as u64)),
            })
            .collect();
        let idx = Index::build(es, 0);
        for i in 0..2 * n {
            assert_eq!(idx.find(&k(i)).leaf.off, (i / 2).min(n - 1) as u64, "key {i}");
        }
        assert_eq!(idx.find(b"samepre").leaf.off, 0);
        assert_eq!(idx.find(b"zzz").leaf.off, (n - 1) as u64);
    }

    #[test]
    fn hot_write_plns_get_larger_limits() {
        let es = entries(400);
        // The last 8 leaves (two PLNs) take nearly every write.
        for (i, e) in es.iter().enumerate() {
            let w = if i >= 392 { 1000 } else { 1 };
            e.leaf.counters.writes.store(w, std::sync::atomic::Ordering::Relaxed);
        }
        let cold = Index::build(es.clone(), 0);
        assert!(cold.plns.iter().all(|p| p.load().limit == cold.pln_limit));
        let idx = Index::build_adaptive(es, 0, true);
        assert_eq!(idx.hot_plns, 2);
        let limits: Vec<usize> = idx.plns.iter().map(|p| p.load().limit).collect();
        assert!(limits[..98].iter().all(|&l| l == idx.pln_limit), "{limits:?}");
        assert!(limits[98..].iter().all(|&l| l > idx.pln_limit), "{limits:?}");
        assert_eq!(idx.leaf_count(), 400);
    }

    #[test]
    fn a_pln_of_a_rebuilt_index_is_four_lines_with_its_slots_inline() {
        // Point operations miss on PLNs of large trees: their size is what
        // the inline capacity trades against spills.
        assert!(std::mem::size_of::<Pln<()>>() <= 256);
        let idx = Index::build(entries(40), 0);
        for p in &idx.plns[..idx.used_plns] {
            let pln = p.load();
            assert!(!pln.words.spilled() && !pln.leaves.spilled());
        }
    }

    #[test]
    fn the_first_leaf_of_a_pln_guesses_from_the_separator_below_it() {
        let idx = Index::build(entries(40), 0);
        let pin = epoch::pin();
        let guessed = |key: &[u8]| {
            let mut seen = None;
            idx.with_leaf_guided(
                &pin,
                key,
                |g, lo, hi, kw| seen = Some((g, lo, hi, kw)),
                |_, cell| {
                    cell.unwrap().store(7, AtomicOrdering::Relaxed);
                },
            );
            seen
        };
        // Leaf 4 (keys k00040..k00049) is the first of the second PLN:
        // below it lies leaf 3's bound, k00039, in the first PLN.
        assert_eq!(guessed(b"k00045"), None, "no guide learned yet");
        let word = |k: &[u8]| crate::format::leaf_nv::key_word(k);
        assert_eq!(
            guessed(b"k00045"),
            Some((7, word(b"k00039"), word(b"k00049"), word(b"k00045")))
        );
        // The very first leaf has nothing below it.
        guessed(b"k00001");
        assert_eq!(guessed(b"k00001"), Some((7, 0, word(b"k00009"), word(b"k00001"))));
        // Leaf 5 is not first: its PLN neighbour bounds it.
        guessed(b"k00055");
        assert_eq!(
            guessed(b"k00055"),
            Some((7, word(b"k00049"), word(b"k00059"), word(b"k00055")))
        );
    }

    #[test]
    fn neighbours() {
        let idx = Index::build(entries(40), 0);
        let f = idx.find(b"k00205");
        assert_eq!(f.leaf.off, 1020);
        assert_eq!(idx.predecessor(f.pln, f.pos).unwrap().leaf.off, 1019);
        assert_eq!(idx.successor(f.pln, f.pos).unwrap().2.leaf.off, 1021);
        let first = idx.find(b"");
        assert!(idx.predecessor(first.pln, first.pos).is_none());
    }
}
