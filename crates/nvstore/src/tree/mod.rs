//! The NV-Tree (NV-Tree §4): crash-consistent leaves in the pool, inner
//! nodes in DRAM.
//!
//! Concurrency (docs/design.md, "Reads"):
//! - readers take no locks: they pin an epoch, load the current index, route
//!   to a leaf and scan its elements up to the leaf's *durable* count, a DRAM
//!   copy of the persistent count that is raised only after the count has
//!   been flushed and fenced, so nothing a crash could lose is ever returned
//!   (docs/design.md, "the publish rule", rule 3);
//! - a writer locks one leaf (a DRAM mutex, never a word in the pool);
//! - splits, replaces and merges are serialised by one structure lock; they
//!   build new leaves, swap them in with one sibling-pointer store, publish a
//!   new PLN (or a rebuilt index), mark the old leaves dead and hand their
//!   blocks to epoch-based reclamation. Appends to other leaves go on meanwhile.

pub mod adaptive;
pub mod index;
pub mod isle;
pub mod leaf;
pub mod mvcc;

use std::collections::{BTreeMap, BTreeSet};
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
use crate::format::validate::Damage;
use crate::pmem::{points, Space};
use adaptive::{LeafCounters, LeafProfile, Profile, Strategy};
use index::{Bound, Entry, Found, Index, Pln};
use leaf::{Keep, LeafFormat, Removed, Slot, Written};
use mvcc::Clock;

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
    /// Formats that change published words in place (isle) make it odd
    /// while they do and until the change is durable; readers retry when
    /// it is odd or moved while they read.
    pub seq: AtomicU64,
    /// Key words at or above this have moved to the right sibling (a split
    /// in place); a reader or writer that routed here with an older index
    /// routes again.
    pub high: AtomicU64,
    /// Workload profile of this leaf (NV-Tree Table 2), DRAM only.
    pub counters: LeafCounters,
    /// Lookup hints of an nv leaf (fingerprints), DRAM only.
    pub hints: std::sync::OnceLock<leaf::Hints>,
    /// Whether the leaf passed [`LeafFormat::validate`] (`None`) or what
    /// is damaged in it; set on first use of a leaf read from media, at
    /// creation for a leaf this process built.
    pub verdict: std::sync::OnceLock<Option<Damage>>,
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
            seq: AtomicU64::new(0),
            high: AtomicU64::new(u64::MAX),
            counters: LeafCounters::default(),
            hints: std::sync::OnceLock::new(),
            verdict: std::sync::OnceLock::new(),
        }
    }

    /// A handle of a leaf this process has just built: sound by construction.
    pub fn built(off: u64, size: u64, count: u64) -> LeafRef {
        let l = LeafRef::with(off, size, count);
        let _ = l.verdict.set(None);
        l
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
    /// Transactions and write batches committed, and those that spanned
    /// several leaves (and so wrote a commit record).
    pub commits: AtomicU64,
    pub multi_leaf_commits: AtomicU64,
    pub conflicts: AtomicU64,
}

/// The tree over a space `S` with leaf format `L`.
pub struct Tree<S: Space, L: LeafFormat> {
    pub space: Arc<S>,
    pub alloc: Arc<Allocator>,
    pub index: ArcSwap<Index>,
    structure: Mutex<()>,
    /// Serialises transaction commits (NV-Tree §6.1.1): at most one multi-leaf
    /// transaction is ever unfinished, so one header word records commits.
    commit_lock: Mutex<()>,
    pub clock: Clock,
    pub node_size: u64,
    pub keys: AtomicI64,
    pub stats: TreeStats,
    pub path: PathBuf,
    /// Test hook run after a split has published its new leaves and released
    /// its locks, before the splitting operation goes on (crash tests use it
    /// to let another writer act inside that window).
    split_hook: Mutex<Option<SplitHook>>,
    /// Workload-adaptive node sizing (NV-Tree §5): strategy, global
    /// counters and the cost model.
    pub adaptive: Profile,
    /// Set once a damaged leaf was found: the tree refuses writes from then on.
    pub damaged: AtomicBool,
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
        last_ts: u64,
        path: PathBuf,
    ) -> Self {
        let leaves = entries.len() as u64;
        Tree {
            space,
            alloc,
            index: ArcSwap::from_pointee(Index::build(entries, 0)),
            structure: Mutex::new(()),
            commit_lock: Mutex::new(()),
            clock: Clock::new(last_ts),
            node_size,
            keys: AtomicI64::new(keys as i64),
            stats: TreeStats::default(),
            path,
            split_hook: Mutex::new(None),
            adaptive: Profile::new(leaves, L::SEARCH_LINE_SHARE),
            damaged: AtomicBool::new(false),
            _leaf: PhantomData,
        }
    }

    /// Checks a leaf before its first use (once per leaf read from media;
    /// see `format::validate`), so no read of it leaves the pool or its
    /// own structures. A damaged leaf is reported as [`Error::Corrupt`]
    /// with the offset every time it is reached, and the tree refuses
    /// writes from then on.
    #[inline]
    pub fn sound(&self, leaf: &LeafRef) -> Result<()> {
        let verdict = match leaf.verdict.get() {
            Some(v) => v,
            None => leaf.verdict.get_or_init(|| self.validate(leaf)),
        };
        match verdict {
            None => Ok(()),
            Some(d) => {
                self.damaged.store(true, Ordering::Relaxed);
                Err(Error::corrupt_at(&self.path, d.off, d.what.clone()))
            }
        }
    }

    #[cold]
    fn validate(&self, leaf: &LeafRef) -> Option<Damage> {
        if leaf.off == 0 && leaf.size == 0 {
            return None; // read-only view of a pool without a first leaf
        }
        // As a reader of a format that changes words in place: again
        // until no writer moved the leaf meanwhile.
        loop {
            let s1 = leaf.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let r = L::validate(&*self.space, leaf.off, self.alloc.data_start());
            std::sync::atomic::fence(Ordering::Acquire);
            if leaf.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            let off = leaf.off;
            return match r {
                Err(d) => Some(d),
                Ok((size, _)) if size != leaf.size => Some(Damage {
                    off,
                    what: format!("leaf {off} has size {size}, the index says {}", leaf.size),
                }),
                Ok((_, Some(count))) if leaf.durable.load(Ordering::Acquire) > count => Some(Damage {
                    off,
                    what: format!("leaf {off} count {count} is below the index's"),
                }),
                Ok(_) => None,
            };
        }
    }

    /// Refuses writes to a tree in which damage was found.
    #[inline]
    fn writable_tree(&self) -> Result<()> {
        if self.damaged.load(Ordering::Relaxed) {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                off: None,
                what: "the pool is damaged (see `nvstore check`); writes are refused, `nvstore salvage` copies what is readable".into(),
            });
        }
        Ok(())
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

    /// Point lookup of the latest state.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_at(key, u64::MAX)
    }

    /// Point lookup as of timestamp `at` (a pinned snapshot's).
    pub fn get_at(&self, key: &[u8], at: u64) -> Result<Option<Vec<u8>>> {
        loop {
            let _g = epoch::pin();
            let idx = self.index.load();
            let f = idx.find(key);
            self.sound(&f.leaf)?;
            self.adaptive.read(&f.leaf.counters);
            if let Some(v) = L::read(&*self.space, &f.leaf, key, at) {
                return Ok(v);
            }
        }
    }

    /// Commit timestamp of `key`'s newest element (a delete's too).
    pub fn newest_version(&self, key: &[u8]) -> Result<Option<u64>> {
        let _g = epoch::pin();
        let leaf = self.index.load().find_leaf(key);
        self.sound(&leaf)?;
        let n = leaf.durable.load(Ordering::Acquire);
        Ok(L::newest(&*self.space, &leaf, n, key, u64::MAX).map(|e| e.version))
    }

    /// Inserts or updates. Durable when it returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        check_sizes(key, value)?;
        self.writable_tree()?;
        self.sound(&self.index.load().find_leaf(key))?;
        let blob = match leaf::blob_size(key, value) {
            Some(sz) => {
                let off = self.alloc.alloc(&*self.space, sz)?;
                leaf::write_blob(&*self.space, off, key, value);
                off
            }
            None => 0,
        };
        loop {
            let guard = epoch::pin();
            let leaf = self.index.load().find_leaf(key);
            let lk = leaf.lock.lock();
            if leaf.dead.load(Ordering::Acquire) {
                continue;
            }
            match L::upsert(&*self.space, &leaf, key, value, blob, &self.clock) {
                Written::Full => {
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
                Written::Moved => continue,
                Written::Done { inserted, freed } => {
                    self.adaptive.wrote(&leaf.counters, L::appended(inserted), 1);
                    drop(lk);
                    if inserted {
                        self.keys.fetch_add(1, Ordering::Relaxed);
                    }
                    self.retire_blob(freed, &guard);
                    self.space.op_boundary();
                    return Ok(());
                }
            }
        }
    }

    /// Deletes; returns whether the key existed. Durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.writable_tree()?;
        self.sound(&self.index.load().find_leaf(key))?;
        loop {
            let guard = epoch::pin();
            let leaf = self.index.load().find_leaf(key);
            let lk = leaf.lock.lock();
            if leaf.dead.load(Ordering::Acquire) {
                continue;
            }
            match L::remove(&*self.space, &leaf, key, &self.clock) {
                Removed::Full => {
                    drop(lk);
                    drop(guard);
                    self.split(key)?;
                    continue;
                }
                Removed::Moved => continue,
                Removed::Done { existed, freed } => {
                    if existed {
                        self.adaptive.wrote(&leaf.counters, 1, 1);
                    }
                    drop(lk);
                    if existed {
                        self.keys.fetch_sub(1, Ordering::Relaxed);
                    }
                    self.retire_blob(freed, &guard);
                    drop(guard);
                    // Deletes free room in formats that remove in place: a
                    // leaf below a quarter full merges with its right
                    // sibling (Isle-Tree §IV-D), under the structure lock.
                    if L::SPLITS_IN_PLACE
                        && existed
                        && leaf.durable.load(Ordering::Relaxed) < L::capacity(leaf.size) / 4
                    {
                        // A merge that cannot allocate changes nothing: the
                        // delete stands either way.
                        let structure = self.structure.lock();
                        let _ = self.split_locked(key, 0, None, true);
                        drop(structure);
                    }
                    self.space.op_boundary();
                    return Ok(existed);
                }
            }
        }
    }

    /// Hands a blob no element refers to any more to epoch reclamation
    /// (readers pinned now may still read it).
    fn retire_blob(&self, blob: Option<u64>, guard: &epoch::Guard) {
        if let Some(b) = blob {
            self.alloc.retire(&[b]);
            let alloc = self.alloc.clone();
            guard.defer(move || alloc.release(&[b]));
        }
    }

    /// Makes room in the full leaf that `key` routes to: split, replace or
    /// merge with the right sibling (NV-Tree §4.4).
    fn split(&self, key: &[u8]) -> Result<()> {
        let structure = self.structure.lock();
        let changed = self.split_locked(key, 2, None, false)?;
        drop(structure);
        if changed {
            let hook = self.split_hook.lock().clone();
            if let Some(h) = hook {
                h();
            }
        }
        self.space.op_boundary();
        Ok(())
    }

    /// The body of a split; the caller holds the structure lock. Makes room
    /// for `need` more elements in the leaf `key` routes to, or, with `cut`,
    /// splits that leaf after the key `cut` whatever its fill (a transaction
    /// with more new keys for one leaf than a leaf holds). Returns whether
    /// anything changed.
    /// With `merge_only`, only merges an underfull leaf with its right
    /// sibling (formats whose deletes free room, like isle, call it when
    /// a leaf falls below a quarter full).
    fn split_locked(&self, key: &[u8], need: u64, cut: Option<&[u8]>, merge_only: bool) -> Result<bool> {
        // The adaptive model learns what a split costs (Model::split_fixed_ns).
        let started = self.adaptive.on().then(std::time::Instant::now);
        let guard = epoch::pin();
        let idx = self.index.load_full();
        let f = idx.find(key);
        let leaf = f.leaf.clone();
        let lk = leaf.lock.lock();
        if leaf.dead.load(Ordering::Acquire) || (cut.is_none() && !merge_only && L::has_room(&*self.space, &leaf, need))
        {
            return Ok(false); // someone else made room
        }
        if merge_only && leaf.durable.load(Ordering::Relaxed) >= L::capacity(leaf.size) / 4 {
            return Ok(false);
        }
        // Keep every version a live (or future) snapshot can read.
        let c = L::collate_leaf(
            &*self.space,
            &leaf,
            Keep::Since(self.clock.oldest()),
            &RB::Unbounded,
            &RB::Unbounded,
        );
        let (mut valid, mut dropped_blobs) = (c.valid, c.dropped_blobs);
        let old_next = L::next(&*self.space, leaf.off);
        // The minimal fill factor is half of this leaf's own capacity
        // (NV-Tree §4.4), whatever size adaptivity gave it.
        let min_fill = L::capacity(leaf.size) / 2;

        // Right sibling in the same PLN, for a merge.
        let right = idx.successor(f.pln, f.pos).filter(|(p, _, _)| *p == f.pln);
        let mut merged: Option<(Entry, parking_lot::MutexGuard<'_, ()>)> = None;
        let mut new_entries: Vec<(Bound, u64, Vec<Slot>)> = Vec::new();
        let mut to_free = vec![leaf.off];
        let boundary = split_point(&valid);

        if L::SPLITS_IN_PLACE && cut.is_none() && !merge_only && valid.len() as u64 >= min_fill {
            if let Some(mid) = word_split_point(&valid) {
                let right = valid.split_off(mid);
                let size = self.split_in_place(&idx, &f, &valid, right, old_next)?;
                if let Some(t) = started {
                    self.adaptive
                        .record_split(leaf.size, &[size], t.elapsed().as_nanos() as f64);
                }
                return Ok(true);
            }
        }
        let merge_ok = right.as_ref().is_some_and(|(_, _, r)| {
            // A damaged sibling is left alone (and reported when reached).
            self.sound(&r.leaf).is_ok()
                && (valid.len() as u64) < min_fill
                && L::count(&*self.space, r.leaf.off) < L::capacity(r.leaf.size) / 2
        });
        if merge_only && !merge_ok {
            return Ok(false);
        }
        if let Some(cut) = cut {
            // Cut: keys up to `cut` left, the rest right (either may be empty).
            let at = valid.partition_point(|e| e.cmp_bytes(cut).is_le());
            let right_half = valid.split_off(at);
            new_entries.push((Bound::Key(cut.into()), 0, valid));
            new_entries.push((f.high.clone(), old_next, right_half));
            self.stats.splits.fetch_add(1, Ordering::Relaxed);
        } else if let Some(mid) = boundary.filter(|_| !merge_only && valid.len() as u64 >= min_fill) {
            // Split: halves (already in key order, a key's versions never
            // parted) to two new leaves.
            let right_half = valid.split_off(mid);
            let sep = Bound::Key(valid.last().expect("non-empty left half").key().into());
            new_entries.push((sep, 0, valid));
            new_entries.push((f.high.clone(), old_next, right_half));
            self.stats.splits.fetch_add(1, Ordering::Relaxed);
        } else if let Some((_, _, r)) = right.as_ref().filter(|_| merge_ok) {
            // Merge with the right sibling into one leaf.
            let rl = r.leaf.lock.lock();
            let rc = L::collate_leaf(
                &*self.space,
                &r.leaf,
                Keep::Since(self.clock.oldest()),
                &RB::Unbounded,
                &RB::Unbounded,
            );
            valid.extend(rc.valid); // every key of the right sibling is above the left's
            dropped_blobs.extend(rc.dropped_blobs);
            let r_next = L::next(&*self.space, r.leaf.off);
            new_entries.push((r.max.clone(), r_next, valid));
            to_free.push(r.leaf.off);
            merged = Some((r.clone(), rl));
            self.stats.merges.fetch_add(1, Ordering::Relaxed);
        } else {
            // Replace: the kept elements alone in a new leaf (a larger one
            // when versions of one key that snapshots still read fill it).
            new_entries.push((f.high.clone(), old_next, valid));
            self.stats.replaces.fetch_add(1, Ordering::Relaxed);
        }

        // Profile of the new leaves (NV-Tree Table 3): halves of the old
        // leaf's counters after a split, all of them after a replace, the
        // sum of both after a merge.
        let mut profile = leaf.counters.get();
        if let Some((m, _)) = &merged {
            profile = profile.plus(m.leaf.counters.get());
        }
        let parts = new_entries.len() as u64;
        let target = self.new_leaf_size(leaf.size, profile);
        // Allocate every new leaf first, so a full pool fails before any change.
        let replaced = new_entries.len() == 1 && merged.is_none();
        let sizes: Vec<u64> = new_entries
            .iter()
            // A replace or a transaction's cut must leave room for the
            // elements the caller is about to add (with adaptivity, `target`
            // may be smaller than what they need).
            .map(|(_, _, es)| self.leaf_size_for(es, if replaced || cut.is_some() { need } else { 0 }, target))
            .collect();
        let mut offs = Vec::with_capacity(new_entries.len());
        for &size in &sizes {
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
        // The first inherits the old leaf's low bound.
        for i in 0..new_entries.len() {
            if i + 1 < new_entries.len() {
                new_entries[i].1 = offs[i + 1];
            }
            let low = match i {
                0 => L::low(&*self.space, leaf.off),
                _ => new_entries[i].2.first().map_or(0, |e| e.words[0]),
            };
            L::build_with_low(
                &*self.space,
                offs[i],
                sizes[i],
                new_entries[i].1,
                &new_entries[i].2,
                low,
            );
        }
        self.space.fence(points::NV_NEWLEAF_FENCE);
        // One atomic store swaps them in.
        let link = match idx.predecessor(f.pln, f.pos) {
            Some(p) => L::next_word(p.leaf.off),
            None => header::LEAF_HEAD_OFF,
        };
        let linked = if link == header::LEAF_HEAD_OFF {
            offs[0]
        } else {
            L::relink(self.space.load(link), offs[0])
        };
        self.space.store(link, linked);
        self.space.flush(link, 8, points::NV_LINK_FLUSH);
        self.space.fence(points::NV_LINK_FENCE);

        // DRAM: new PLN (or a rebuilt index), then retire the old leaves.
        let fresh: Vec<Entry> = new_entries
            .iter()
            .zip(offs.iter().zip(&sizes))
            .map(|((max, _, elems), (&off, &size))| {
                let l = LeafRef::built(off, size, elems.len() as u64);
                l.counters.set(profile.share(parts));
                Entry {
                    max: max.clone(),
                    leaf: Arc::new(l),
                }
            })
            .collect();
        let pln = idx.plns[f.pln].load();
        let remove = if merged.is_some() { 2 } else { 1 };
        self.adaptive.leaves.fetch_add(parts, Ordering::Relaxed);
        self.adaptive.leaves.fetch_sub(remove as u64, Ordering::Relaxed);
        let mut entries = pln.entries.clone();
        entries.splice(f.pos..f.pos + remove, fresh);
        if entries.len() <= pln.limit {
            idx.plns[f.pln].store(Arc::new(Pln::new(entries, pln.limit)));
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
        if let Some(t) = started {
            self.adaptive
                .record_split(leaf.size, &sizes, t.elapsed().as_nanos() as f64);
        }
        Ok(true)
    }

    /// Split in place (formats with [`LeafFormat::SPLITS_IN_PLACE`]): the
    /// upper part `right` of the leaf `f` routes to goes to one new leaf,
    /// the rest stays. The caller holds the structure lock and the leaf's.
    /// Returns the new leaf's size.
    fn split_in_place(
        &self,
        idx: &Arc<Index>,
        f: &Found,
        left: &[Slot],
        right: Vec<Slot>,
        old_next: u64,
    ) -> Result<u64> {
        let size = self.leaf_size_for(&right, 0, self.node_size.max(f.leaf.size));
        let off = self.alloc.alloc(&*self.space, size)?;
        let low = right[0].words[0];
        L::build_with_low(&*self.space, off, size, old_next, &right, low);
        self.space.fence(points::NV_NEWLEAF_FENCE);
        // Writers and readers that routed here with the old index route again.
        f.leaf.high.store(low, Ordering::Release);
        L::split_in_place(&*self.space, &f.leaf, off, &right);
        let sep = Bound::Key(left.last().expect("a non-empty left part").key().into());
        let fresh = vec![
            Entry {
                max: sep,
                leaf: f.leaf.clone(),
            },
            Entry {
                max: f.high.clone(),
                leaf: Arc::new(LeafRef::built(off, size, right.len() as u64)),
            },
        ];
        let pln = idx.plns[f.pln].load();
        let mut entries = pln.entries.clone();
        entries.splice(f.pos..f.pos + 1, fresh);
        if entries.len() <= pln.limit {
            idx.plns[f.pln].store(Arc::new(Pln::new(entries, pln.limit)));
        } else {
            self.rebuild_from_plns(idx, f.pln, entries);
        }
        self.stats.splits.fetch_add(1, Ordering::Relaxed);
        Ok(size)
    }

    /// Size of a new leaf for `elems` and `extra` more: `target`, or
    /// larger when they would leave it without room for one more update.
    fn leaf_size_for(&self, elems: &[Slot], extra: u64, target: u64) -> u64 {
        let mut size = target;
        while !L::fits(size, elems, extra + 2) {
            size *= 2;
        }
        size
    }

    /// The size for the leaves that replace a full leaf of `size` bytes
    /// with `profile`: the node size when adaptivity is off, else
    /// Algorithm 3 bounded by the model (NV-Tree §5.3–5.4).
    fn new_leaf_size(&self, size: u64, profile: LeafProfile) -> u64 {
        let s = self.adaptive.strategy();
        if s == Strategy::Off {
            return self.node_size;
        }
        let c = self.adaptive.counts(profile);
        let new = self.adaptive.model().new_size(s, size, &c);
        match new.cmp(&size) {
            std::cmp::Ordering::Greater => self.adaptive.enlarged.fetch_add(1, Ordering::Relaxed),
            std::cmp::Ordering::Less => self.adaptive.shrunk.fetch_add(1, Ordering::Relaxed),
            std::cmp::Ordering::Equal => 0,
        };
        new
    }

    /// Selects the adaptive strategy from now on (profiling starts and
    /// stops with it).
    pub fn set_adaptive(&self, s: Strategy) {
        self.adaptive.set_strategy(s);
    }

    /// Installs (or removes) the split hook. For crash tests only.
    #[doc(hidden)]
    pub fn set_split_hook(&self, hook: Option<SplitHook>) {
        *self.split_hook.lock() = hook;
    }

    /// Rebuild-from-PLN (NV-Tree §4.5): a PLN overflowed; lay every entry
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
        let new = Index::build_adaptive(all, idx.generation + 1, self.adaptive.on());
        self.adaptive.hot_plns.fetch_add(new.hot_plns as u64, Ordering::Relaxed);
        self.index.store(Arc::new(new));
        self.stats.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rebuild_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The live elements of one leaf within the range, in key order. Values
    /// that live in blobs are read now, while the epoch is pinned; inline
    /// keys and values are materialised only when the iterator yields them.
    fn leaf_range(&self, f: &Found, lo: &KeyBound, hi: &KeyBound, at: u64) -> Result<Vec<Pending>> {
        self.sound(&f.leaf)?;
        Ok(L::collate_leaf(&*self.space, &f.leaf, Keep::At(at), lo, hi)
            .valid
            .into_iter()
            .map(|e| {
                let blob_value = e.value_in_blob().then(|| leaf::element_value(&*self.space, &e.words));
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
            lo,
            hi,
            reverse,
            at: pin.as_ref().map_or(u64::MAX, |p| p.ts),
            _pin: pin,
            buf: Vec::new(),
            done: false,
            error: None,
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

    /// One leaf's part of a commit: checks its keys for conflicts and lists,
    /// per written key, the live element it replaces (if any).
    fn plan_leaf(
        &self,
        leaf: &LeafRef,
        n: u64,
        ks: &[usize],
        keys: &[(&[u8], Role)],
        values: &[&Option<Vec<u8>>],
        start: u64,
    ) -> LeafPlan {
        let mut p = LeafPlan::default();
        for &i in ks {
            let (k, role) = &keys[i];
            let newest = L::newest(&*self.space, leaf, n, k, u64::MAX);
            let limit = match role {
                Role::Write(_) => start,
                Role::Watch(since) => *since,
            };
            if newest.is_some_and(|e| e.version > limit) {
                p.conflict = true;
            }
            let Role::Write(w) = role else { continue };
            let old = newest
                .filter(|e| !e.negative)
                .map(|e| L::element(&*self.space, leaf.off, e.index));
            let k_need = values[*w].is_some() as u64 + old.is_some() as u64;
            p.delta += values[*w].is_some() as i64 - old.is_some() as i64;
            if k_need > 0 {
                p.needy.push(k.to_vec());
            }
            p.need += k_need;
            p.plan.push((*w, old.map(|o| o.words)));
        }
        p
    }

    /// The elements a leaf's plan appends, stamped with `ts`.
    fn elements(
        &self,
        plan: &[(usize, Option<[u64; 4]>)],
        wkeys: &[&Vec<u8>],
        values: &[&Option<Vec<u8>>],
        blobs: &[u64],
        ts: u64,
        txn: bool,
    ) -> Vec<[u64; 4]> {
        let mut elems = Vec::with_capacity(plan.len() * 2);
        for (i, old) in plan {
            if let Some(o) = old {
                elems.push(leaf::negate(*o, ts, txn));
            }
            if let Some(v) = values[*i] {
                elems.push(leaf::encode(wkeys[*i], v, blobs[*i], ts, txn));
            }
        }
        elems
    }

    /// Commits a transaction's buffered writes (`None`: delete) atomically,
    /// durable when it returns: first-committer-wins against every write
    /// newer than `start` to a written key, and against every write newer
    /// than its `since` to a watched key. `start == u64::MAX` (a blind
    /// write batch) checks nothing. Returns the commit timestamp.
    ///
    /// Under the commit lock and the structure lock, the leaves of all keys
    /// are locked in chain order; leaves without room are split first
    /// (before any append, so a full pool fails cleanly). Then one
    /// timestamp is taken and each leaf gets one append. Writes to a single
    /// leaf are published by its one count store; across leaves, elements
    /// carry the TXN flag and count only once the header's commit record
    /// (`txn_commit = ts`) is durable. Readers see none of it before then:
    /// the leaves' DRAM counts are raised last.
    pub fn commit(
        &self,
        writes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        watches: &[(Vec<u8>, u64)],
        start: u64,
    ) -> Result<u64> {
        if !L::VERSIONED {
            return Err(Error::Unsupported(format!(
                "{} leaves keep no versions: transactions and write batches need an nv pool",
                L::NAME
            )));
        }
        for (k, v) in writes {
            check_sizes(k, v.as_deref().unwrap_or_default())?;
        }
        self.writable_tree()?;
        {
            // Every leaf the commit reads or writes is sound (checked once).
            let _guard = epoch::pin();
            let idx = self.index.load();
            for k in writes.keys().chain(watches.iter().map(|(k, _)| k)) {
                self.sound(&idx.find_leaf(k))?;
            }
        }
        // Blobs first, outside every lock.
        let mut blobs: Vec<u64> = Vec::with_capacity(writes.len());
        let free_blobs = |blobs: &[u64]| {
            for &b in blobs.iter().filter(|&&b| b != 0) {
                self.alloc.free(b);
            }
        };
        for (k, v) in writes {
            let b = match v.as_deref().and_then(|v| leaf::blob_size(k, v).map(|sz| (v, sz))) {
                Some((v, sz)) => match self.alloc.alloc(&*self.space, sz) {
                    Ok(off) => {
                        leaf::write_blob(&*self.space, off, k, v);
                        off
                    }
                    Err(e) => {
                        free_blobs(&blobs);
                        return Err(e);
                    }
                },
                None => 0,
            };
            blobs.push(b);
        }
        // Every key the commit looks at, in key order: written ones carry
        // their index in `writes`, watched ones their `since`.
        let mut keys: Vec<(&[u8], Role)> = writes
            .keys()
            .enumerate()
            .map(|(i, k)| (k.as_slice(), Role::Write(i)))
            .chain(watches.iter().map(|(k, since)| (k.as_slice(), Role::Watch(*since))))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        let values: Vec<&Option<Vec<u8>>> = writes.values().collect();
        let wkeys: Vec<&Vec<u8>> = writes.keys().collect();

        if keys.is_empty() {
            return Ok(self.clock.visible());
        }

        // Fast path: every key in one leaf with room for the elements. The
        // leaf lock alone orders this commit against every other writer of
        // its keys (plain writes and commits lock it too) and one count
        // store publishes it: no commit lock, no structure lock.
        {
            let _guard = epoch::pin();
            let idx = self.index.load();
            let leaf = idx.find(keys[0].0).leaf;
            // Keys are sorted: if the first and last route to one leaf, all do.
            if Arc::ptr_eq(&leaf, &idx.find(keys[keys.len() - 1].0).leaf) {
                drop(idx);
                let lk = leaf.lock.lock();
                let n = leaf.durable.load(Ordering::Relaxed);
                let all: Vec<usize> = (0..keys.len()).collect();
                let p = self.plan_leaf(&leaf, n, &all, &keys, &values, start);
                if !leaf.dead.load(Ordering::Acquire) {
                    if p.conflict {
                        drop(lk);
                        free_blobs(&blobs);
                        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::Conflict);
                    }
                    if n + p.need <= L::capacity(leaf.size) {
                        let w = self.clock.begin_write();
                        let elems = self.elements(&p.plan, &wkeys, &values, &blobs, w.ts, false);
                        if !elems.is_empty() {
                            L::append(&*self.space, &leaf, n, &elems);
                        }
                        leaf.durable.store(n + elems.len() as u64, Ordering::Release);
                        self.adaptive
                            .wrote(&leaf.counters, elems.len() as u64, keys.len() as u64);
                        self.keys.fetch_add(p.delta, Ordering::Relaxed);
                        let ts = w.ts;
                        drop(w);
                        drop(lk);
                        self.stats.commits.fetch_add(1, Ordering::Relaxed);
                        self.space.op_boundary();
                        return Ok(ts);
                    }
                }
            }
        }

        let _commit = self.commit_lock.lock();
        let structure = self.structure.lock();
        let ts = loop {
            let _guard = epoch::pin();
            let idx = self.index.load_full();
            // Group the keys by leaf; leaves come in chain order.
            let mut groups: Vec<(Arc<LeafRef>, Vec<usize>)> = Vec::new();
            for (i, (k, _)) in keys.iter().enumerate() {
                let leaf = idx.find(k).leaf;
                match groups.last_mut() {
                    Some((l, ks)) if Arc::ptr_eq(l, &leaf) => ks.push(i),
                    _ => groups.push((leaf, vec![i])),
                }
            }
            let locks: Vec<_> = groups.iter().map(|(l, _)| l.lock.lock()).collect();
            // Validate, and gather each leaf's elements (version filled in below).
            let mut plans: Vec<Vec<(usize, Option<[u64; 4]>)>> = Vec::with_capacity(groups.len());
            let mut room: Option<(Vec<u8>, u64, Option<Vec<u8>>)> = None;
            let mut conflict = false;
            let mut delta = 0i64;
            for (leaf, ks) in &groups {
                let n = leaf.durable.load(Ordering::Relaxed);
                let LeafPlan {
                    plan,
                    need,
                    needy,
                    conflict: c,
                    delta: d,
                } = self.plan_leaf(leaf, n, ks, &keys, &values, start);
                conflict |= c;
                delta += d;
                if n + need > L::capacity(leaf.size) && room.is_none() {
                    let cut = (need > L::capacity(leaf.size) / 2 && needy.len() > 1)
                        .then(|| needy[needy.len() / 2 - 1].to_vec());
                    room = Some((needy[0].to_vec(), need, cut));
                }
                plans.push(plan);
            }
            if conflict {
                drop(locks);
                drop(structure);
                free_blobs(&blobs);
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Conflict);
            }
            if let Some((key, need, cut)) = room {
                drop(locks);
                if let Err(e) = self.split_locked(&key, need, cut.as_deref(), false) {
                    drop(structure);
                    free_blobs(&blobs);
                    return Err(e);
                }
                continue;
            }
            // Everything fits: take the timestamp and append, leaf by leaf.
            let w = self.clock.begin_write();
            let multi = plans
                .iter()
                .filter(|p| p.iter().any(|(i, old)| old.is_some() || values[*i].is_some()))
                .count()
                > 1;
            let mut counts = Vec::with_capacity(groups.len());
            for ((leaf, _), plan) in groups.iter().zip(&plans) {
                let n = leaf.durable.load(Ordering::Relaxed);
                let elems = self.elements(plan, &wkeys, &values, &blobs, w.ts, multi);
                if !elems.is_empty() {
                    L::append(&*self.space, leaf, n, &elems);
                }
                counts.push((n + elems.len() as u64, plan.len() as u64));
            }
            if multi {
                self.space.store(header::TXN_COMMIT_OFF, w.ts);
                self.space.flush(header::TXN_COMMIT_OFF, 8, points::TXN_COMMIT_FLUSH);
                self.space.fence(points::TXN_COMMIT_FENCE);
                self.stats.multi_leaf_commits.fetch_add(1, Ordering::Relaxed);
            }
            for ((leaf, _), (n, lookups)) in groups.iter().zip(counts) {
                let before = leaf.durable.swap(n, Ordering::Release);
                self.adaptive.wrote(&leaf.counters, n - before, lookups);
            }
            self.keys.fetch_add(delta, Ordering::Relaxed);
            let ts = w.ts;
            drop(w);
            drop(locks);
            break ts;
        };
        drop(structure);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.space.op_boundary();
        Ok(ts)
    }

    /// Every leaf offset in chain order, with its element count.
    /// Checks every leaf of the index (`format::validate`) without
    /// collating any: the first damage found, as [`Tree::sound`] reports it.
    pub fn validate_leaves(&self) -> Result<()> {
        let _g = epoch::pin();
        let idx = self.index.load();
        for e in idx.entries().iter() {
            self.sound(&e.leaf)?;
        }
        Ok(())
    }

    pub fn leaf_offsets(&self) -> Vec<(u64, u64)> {
        self.index
            .load()
            .entries()
            .iter()
            .map(|e| (e.leaf.off, e.leaf.durable.load(Ordering::Acquire)))
            .collect()
    }
}

/// The index nearest the middle of `valid` (key-ordered, a key's versions
/// adjacent) where a new key starts, so a split never parts a key's
/// versions; `None` when one key holds them all.
fn split_point(valid: &[Slot]) -> Option<usize> {
    let len = valid.len();
    let mid = len / 2;
    let starts_key = |i: usize| i > 0 && i < len && valid[i - 1].key_cmp(&valid[i]).is_ne();
    (0..=len).find_map(|d| {
        [mid + d, mid.wrapping_sub(d)]
            .into_iter()
            .find(|&i| i <= len && starts_key(i))
    })
}

/// The index nearest the middle of `valid` (key-ordered) where the key
/// word grows, so every key word left of it is below every one right of
/// it; `None` when one word covers them all.
fn word_split_point(valid: &[Slot]) -> Option<usize> {
    let len = valid.len();
    let mid = len / 2;
    // u64::MAX is the "no bound" value of a leaf's `high`.
    let starts =
        |i: usize| i > 0 && i < len && valid[i - 1].words[0] < valid[i].words[0] && valid[i].words[0] < u64::MAX;
    (0..=len).find_map(|d| {
        [mid + d, mid.wrapping_sub(d)]
            .into_iter()
            .find(|&i| i <= len && starts(i))
    })
}

/// `KeyTooLarge` for a key beyond [`MAX_KEY`].
pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            limit: MAX_KEY,
        });
    }
    Ok(())
}

pub(crate) fn check_sizes(key: &[u8], value: &[u8]) -> Result<()> {
    check_key(key)?;
    if value.len() > MAX_VALUE {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            limit: MAX_VALUE,
        });
    }
    Ok(())
}

/// What a commit does with one key: write it (index into the writes) or
/// only check it has no commit newer than `since` (a watch).
enum Role {
    Write(usize),
    Watch(u64),
}

/// One leaf's part of a commit ([`Tree::plan_leaf`]).
#[derive(Default)]
struct LeafPlan {
    /// Per written key: its index and the words of the live element it replaces.
    plan: Vec<(usize, Option<[u64; 4]>)>,
    /// Elements to append.
    need: u64,
    /// Written keys that append something, in key order.
    needy: Vec<Vec<u8>>,
    conflict: bool,
    /// Change in the number of live keys.
    delta: i64,
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
    /// Timestamp read at (`u64::MAX`: the latest state).
    at: u64,
    _pin: Option<Arc<SnapshotPin<S, L>>>,
    /// Pending elements, in reverse of the order they are yielded.
    buf: Vec<Pending>,
    done: bool,
    /// The damage that stopped the iterator, until [`RangeIter::checked`] hands it on.
    error: Option<Error>,
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
            let mut pairs = match self.tree.leaf_range(&f, &self.lo, &self.hi, self.at) {
                Ok(p) => p,
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                    return;
                }
            };
            if self.reverse {
                // buf pops from the end: keep ascending so the largest comes first.
                self.buf = pairs;
                match f.low {
                    Bound::NegInf => self.done = true,
                    Bound::Key(k) => self.hi = RB::Included(k.to_vec()),
                    Bound::PosInf => self.done = true,
                }
            } else {
                pairs.reverse();
                self.buf = pairs;
                match f.high {
                    Bound::PosInf => self.done = true,
                    Bound::Key(k) => self.lo = RB::Excluded(k.to_vec()),
                    Bound::NegInf => {}
                }
            }
        }
    }
}

impl<S: Space, L: LeafFormat> RangeIter<S, L> {
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
