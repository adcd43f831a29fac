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
pub mod collate;
pub mod commit;
pub mod cursor;
pub mod hints;
pub mod index;
pub mod isle;
pub mod leaf;
pub mod mvcc;
pub mod nv;
pub mod split;
pub mod swap;
pub mod sync;

use std::marker::PhantomData;
use std::ops::Bound as RB;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch as epoch;
use parking_lot::Mutex;

use crate::alloc::Allocator;
use crate::error::{Error, Result};
use crate::format::element;
use crate::format::header;
use crate::format::validate::Damage;
use crate::pmem::{points, Space};
use adaptive::{LeafCounters, Profile, Strategy};
use index::{Entry, Index};
use leaf::{LeafFormat, Removed, Written};
use mvcc::Clock;
use swap::Swap;

pub use cursor::{in_range, no_keys_between, RangeIter, SnapshotPin};

/// Largest key, in bytes.
pub const MAX_KEY: usize = 64 * 1024;
/// Largest value, in bytes.
pub const MAX_VALUE: usize = 16 * 1024 * 1024;

/// DRAM handle of one leaf, with its format's own DRAM state `St`
/// ([`LeafFormat::State`]; [`Leaf`] names the handle of a format). Laid
/// out in field order, the fields a lookup reads first (so they share the
/// handle's first cache lines): the generic words, then the format's state.
#[repr(C)]
pub struct LeafRef<St> {
    pub off: u64,
    pub size: u64,
    /// Elements known durable: readers scan up to here.
    pub durable: AtomicU64,
    /// Key words at or above this have moved to the right sibling (a split
    /// in place); a reader or writer that routed here with an older index
    /// routes again.
    pub high: AtomicU64,
    /// Set once `verdict` is known sound: the check every lookup makes
    /// reads this word on the handle's first line, not the verdict
    /// further on.
    pub checked: AtomicBool,
    /// What the leaf's format keeps of it in DRAM only (nv: lookup hints;
    /// isle: the in-place change sequence), read by that format alone.
    pub state: St,
    /// Whether the leaf passed [`LeafFormat::validate`] (`None`) or what
    /// is damaged in it; set on first use of a leaf read from media, at
    /// creation for a leaf this process built.
    pub verdict: std::sync::OnceLock<Option<Damage>>,
    /// Set once the leaf has been replaced; writers that find it retry.
    pub dead: AtomicBool,
    /// Held by a writer of the leaf (see [`sync`]).
    pub lock: sync::LeafLock,
    /// Workload profile of this leaf (NV-Tree Table 2), DRAM only.
    pub counters: LeafCounters,
}

/// The leaf handle of format `L`.
pub type Leaf<L> = LeafRef<<L as LeafFormat>::State>;

impl<St: Default> LeafRef<St> {
    pub fn new(off: u64) -> Self {
        LeafRef::with(off, 0, 0)
    }
    pub fn with(off: u64, size: u64, count: u64) -> Self {
        LeafRef {
            off,
            size,
            durable: AtomicU64::new(count),
            high: AtomicU64::new(u64::MAX),
            state: St::default(),
            verdict: std::sync::OnceLock::new(),
            dead: AtomicBool::new(false),
            lock: sync::LeafLock::new(),
            checked: AtomicBool::new(false),
            counters: LeafCounters::default(),
        }
    }

    /// A handle of a leaf this process has just built: sound by construction.
    pub fn built(off: u64, size: u64, count: u64) -> Self {
        let l = LeafRef::with(off, size, count);
        let _ = l.verdict.set(None);
        l.checked.store(true, Ordering::Relaxed);
        l
    }
}

/// What one attempt of a point write came to, decided while the leaf was
/// borrowed from its PLN.
enum Step {
    /// The leaf has no room: split (or rewrite) it, then try again.
    Full,
    /// The leaf was replaced or split meanwhile: route again.
    Again,
    /// An update found no such key: nothing written.
    Absent,
    /// Written and durable; `changed` says whether the key count moved.
    Done { changed: bool, freed: Option<u64> },
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
    pub index: Swap<Index<L::State>>,
    structure: Mutex<()>,
    /// Serialises transaction commits (NV-Tree §6.1.1): at most one multi-leaf
    /// transaction is ever unfinished, so one header word records commits.
    commit_lock: Mutex<()>,
    pub clock: Clock,
    pub node_size: u64,
    pub keys: sync::KeyCount,
    pub stats: TreeStats,
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
        entries: Vec<Entry<L::State>>,
        node_size: u64,
        keys: u64,
        last_ts: u64,
    ) -> Self {
        let leaves = entries.len() as u64;
        Tree {
            space,
            alloc,
            index: Swap::from_pointee(Index::build(entries, 0)),
            structure: Mutex::new(()),
            commit_lock: Mutex::new(()),
            clock: Clock::new(last_ts),
            node_size,
            keys: sync::KeyCount::new(keys as i64),
            stats: TreeStats::default(),
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
    pub fn sound(&self, leaf: &Leaf<L>) -> Result<()> {
        if leaf.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        self.sound_slow(leaf)
    }

    #[cold]
    fn sound_slow(&self, leaf: &Leaf<L>) -> Result<()> {
        let verdict = match leaf.verdict.get() {
            Some(v) => v,
            None => leaf.verdict.get_or_init(|| self.validate(leaf)),
        };
        match verdict {
            None => {
                leaf.checked.store(true, Ordering::Release);
                Ok(())
            }
            Some(d) => {
                self.damaged.store(true, Ordering::Relaxed);
                Err(Error::corrupt_at(d.off, d.what.clone()))
            }
        }
    }

    #[cold]
    fn validate(&self, leaf: &Leaf<L>) -> Option<Damage> {
        if leaf.off == 0 && leaf.size == 0 {
            return None; // read-only view of a pool without a first leaf
        }
        // With the format's reader protocol: a format that changes words
        // in place reads again until no writer moved the leaf meanwhile.
        let r = L::read_settled(leaf, || L::validate(&*self.space, leaf.off, self.alloc.data_start()));
        let off = leaf.off;
        match r {
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
        }
    }

    /// Refuses writes to a tree in which damage was found.
    #[inline]
    fn writable_tree(&self) -> Result<()> {
        if self.damaged.load(Ordering::Relaxed) {
            return Err(Error::corrupt(
                "the pool is damaged (see `nvstore check`); writes are refused, `nvstore salvage` copies what is readable",
            ));
        }
        if !self.clock.has_room() {
            return Err(Error::ClockExhausted {
                path: Default::default(),
                last: self.clock.last(),
                limit: Clock::LIMIT,
            });
        }
        Ok(())
    }

    /// Writes the first, empty leaf of a new pool and links it from the header.
    pub(crate) fn create_first_leaf(space: &S, alloc: &Allocator, node_size: u64) -> Result<u64> {
        let off = alloc.alloc(space, node_size)?;
        L::build(space, off, node_size, 0, &[]);
        space.fence(points::NV_NEWLEAF_FENCE);
        header::set_root(space, header::leaf_head_word(), off);
        Ok(off)
    }

    pub fn len(&self) -> u64 {
        self.keys.get().max(0) as u64
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
        self.get_with_at(key, at, <[u8]>::to_vec)
    }

    /// Point lookup of the latest state that lends the value to `f`
    /// instead of copying it out: `None` when `key` has no value.
    #[inline]
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        self.get_with_at(key, u64::MAX, f)
    }

    /// [`Tree::get_with`] as of timestamp `at`. `f` runs with the epoch
    /// pinned (the value's blob cannot be reclaimed meanwhile), so it
    /// should not block for long.
    #[inline]
    pub fn get_with_at<R>(&self, key: &[u8], at: u64, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        loop {
            let pin = epoch::pin();
            let space = &*self.space;
            let found = self.with_sound_leaf(&pin, key, false, |leaf| -> Result<_> {
                self.adaptive.read(&leaf.counters);
                Ok(L::read_ref(space, leaf, key, at))
            })?;
            if let Some(v) = found {
                return Ok(v.map(|v| v.with(&*self.space, f)));
            }
        }
    }

    /// Runs `f` on the leaf `key` routes to in the current index,
    /// borrowed from its PLN (`Index::with_leaf`), once the leaf is known
    /// sound ([`Tree::sound`]). For an 8-byte key the line(s) of the leaf
    /// most likely to hold it are prefetched first
    /// (`LeafFormat::prefetch_guess`), so that miss overlaps the one on
    /// the leaf's handle; a writer (`write`) also starts fetching the
    /// line it will store to (`LeafFormat::prefetch_head`). Every point
    /// operation (read, write, delete) routes here. A PLN slot with no
    /// guide yet gets one.
    #[inline]
    fn with_sound_leaf<R>(
        &self,
        pin: &epoch::Guard,
        key: &[u8],
        write: bool,
        f: impl FnOnce(&Arc<Leaf<L>>) -> Result<R>,
    ) -> Result<R> {
        let space = &*self.space;
        let guess = |guide, lo, hi, kw| {
            if write {
                L::prefetch_head(space, guide);
            }
            if key.len() == 8 {
                L::prefetch_guess(space, guide, lo, hi, kw);
            }
        };
        self.index.get(pin).with_leaf_guided(pin, key, guess, |leaf, guide| {
            self.sound(leaf)?;
            let r = f(leaf);
            if let Some(g) = guide.filter(|g| g.load(Ordering::Relaxed) == 0) {
                g.store(L::guide(space, leaf), Ordering::Relaxed);
            }
            r
        })
    }

    /// Commit timestamp of `key`'s newest element (a delete's too).
    pub fn newest_version(&self, key: &[u8]) -> Result<Option<u64>> {
        let pin = epoch::pin();
        let leaf = self.index.get(&pin).find_leaf(key);
        self.sound(&leaf)?;
        let n = leaf.durable.load(Ordering::Acquire);
        Ok(L::newest(&*self.space, &leaf, n, key, u64::MAX).map(|e| e.version))
    }

    /// Inserts or updates. Durable when it returns.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, value, false).map(|_| ())
    }

    /// Replaces the value of a key that exists, in one descent; writes
    /// nothing and answers false when the key is absent. Durable when it
    /// returns.
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, value, true)
    }

    /// [`Tree::put`], or with `existing` [`Tree::update`]: whether the key
    /// was there before.
    fn write(&self, key: &[u8], value: &[u8], existing: bool) -> Result<bool> {
        check_sizes(key, value)?;
        self.writable_tree()?;
        let blob = match element::blob_size(key, value) {
            Some(sz) => {
                let off = self.alloc.alloc(&*self.space, sz)?;
                element::write_blob(&*self.space, off, key, value);
                off
            }
            None => 0,
        };
        let unblob = |e: Error| {
            if blob != 0 {
                self.alloc.free(blob);
            }
            e
        };
        loop {
            let guard = epoch::pin();
            // The leaf is borrowed from its PLN for the whole write (no
            // reference-count traffic on its handle), and routing happens
            // once: the soundness check rides on the same lookup.
            let step = self.with_sound_leaf(&guard, key, true, |leaf| -> Result<Step> {
                let _lk = leaf.lock.lock();
                if leaf.dead.load(Ordering::Acquire) {
                    return Ok(Step::Again);
                }
                Ok(
                    match L::upsert(&*self.space, leaf, key, value, blob, existing, &self.clock) {
                        Written::Full => Step::Full,
                        Written::Moved => Step::Again,
                        Written::Absent => Step::Absent,
                        Written::Done { inserted, freed } => {
                            self.adaptive.wrote(&leaf.counters, L::appended(inserted), 1);
                            Step::Done {
                                changed: inserted,
                                freed,
                            }
                        }
                    },
                )
            });
            match step.map_err(unblob)? {
                Step::Full => {
                    drop(guard);
                    self.split(key).map_err(unblob)?;
                }
                Step::Again => {}
                Step::Absent => {
                    if blob != 0 {
                        self.alloc.free(blob);
                    }
                    return Ok(false);
                }
                Step::Done { changed, freed } => {
                    if changed {
                        self.keys.add(1);
                    }
                    self.retire_blob(freed, &guard);
                    self.space.op_boundary();
                    return Ok(!changed);
                }
            }
        }
    }

    /// Deletes; returns whether the key existed. Durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.writable_tree()?;
        loop {
            let guard = epoch::pin();
            let mut low = false;
            let step = self.with_sound_leaf(&guard, key, true, |leaf| -> Result<Step> {
                let _lk = leaf.lock.lock();
                if leaf.dead.load(Ordering::Acquire) {
                    return Ok(Step::Again);
                }
                Ok(match L::remove(&*self.space, leaf, key, &self.clock) {
                    Removed::Full => Step::Full,
                    Removed::Moved => Step::Again,
                    Removed::Done { existed, freed } => {
                        if existed {
                            self.adaptive.wrote(&leaf.counters, 1, 1);
                            low =
                                L::SPLITS_IN_PLACE && leaf.durable.load(Ordering::Relaxed) < L::capacity(leaf.size) / 4;
                        }
                        Step::Done {
                            changed: existed,
                            freed,
                        }
                    }
                })
            })?;
            match step {
                Step::Full => {
                    drop(guard);
                    self.split(key)?;
                }
                Step::Again | Step::Absent => {}
                Step::Done {
                    changed: existed,
                    freed,
                } => {
                    if existed {
                        self.keys.add(-1);
                    }
                    self.retire_blob(freed, &guard);
                    drop(guard);
                    // Deletes free room in formats that remove in place: a
                    // leaf below a quarter full merges with its right
                    // sibling (Isle-Tree §IV-D), under the structure lock.
                    if low {
                        // A merge that cannot allocate changes nothing: the
                        // delete stands either way.
                        let structure = self.structure.lock();
                        let _ = self.rewrite(key, split::Goal::Merge);
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
