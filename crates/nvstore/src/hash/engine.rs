//! The hash engine as `Db` sees it: the persistent table for point
//! operations plus the ordered DRAM index for range and prefix queries
//! (KVS B+Tree index §2), on one pool.
//!
//! - Point gets go straight to the table; the index is not consulted.
//! - A write changes the table and the index under one mutex that
//!   serialises writers across both, so the index always names exactly the
//!   table's keys once a write returns (the table and the index each
//!   serialise their own writers already; the mutex only makes the pair of
//!   updates one step). A new key goes into the index while its table
//!   slot's flush is written back, before the table publishes it
//!   ([`HashEngine::index_writer`]); a group of puts inserts its new keys
//!   after it lets go of the mutex, holding the index's own writer lock
//!   taken under it ([`HashEngine::put_group`]).
//! - A range walks one snapshot of the index and reads each key's value
//!   from the table; a key deleted meanwhile is skipped, so a range sees
//!   every key that was present throughout it and none that never was.
//! - Open always scans the table: it validates every published slot and
//!   lists the blocks the allocator rebuild needs. The index is then
//!   loaded from the image a clean close saved ([`save_image`]), or, after
//!   a crash or when the image does not validate, rebuilt by sorting the
//!   table's keys.
//!
//! # The saved index
//!
//! A clean close writes the index's keys, in order, into one block
//! (`format/saved.rs` sealing: magic, length, CRC-32; body `{ IMAGE_TAG,
//! key_count, key[key_count] }`, each key as length + words), flushes it
//! (`hash.image.flush`), and publishes its offset in the header's clean
//! word with one store, the low 16 bits of the image's checksum above the
//! offset (as the tree's saved state does): the clean word's own fence
//! orders the image's flush before the close is acknowledged. The next
//! open trusts the image only if its magic, length, checksum and tag
//! match, its keys are strictly ascending and their count is the table's;
//! else it rebuilds. The block is not reachable from the table, so the
//! allocator rebuild of a writable open frees it (after the clean word is
//! cleared, before any other write); a read-only open counts it as used.

use std::ops::Bound as RB;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::index::{self, Index};
use super::table::HashTable;
use crate::alloc::Allocator;
use crate::check::CheckReport;
use crate::error::{Error, Result};
use crate::format::header::{self, Header};
use crate::format::saved;
use crate::pmem::Space;
use crate::recovery::{Recovery, RecoveryKind};
use crate::tree::mvcc::Clock;
use crate::tree::TreeStats;

/// The value of the header's clean word after a clean close of a hash
/// pool opened without its index (nothing saved): the next open rebuilds
/// it. Any other nonzero value names a saved image.
pub const CLEAN_MARK: u64 = 1;

/// The first body word of a saved index image.
pub const IMAGE_TAG: u64 = u64::from_le_bytes(*b"HASHIDX1");

/// The clean word: the image's offset in the low 48 bits, the low 16 bits
/// of its checksum above them.
const CLEAN_TAG_SHIFT: u32 = 48;
const CLEAN_OFFSET_MASK: u64 = (1 << CLEAN_TAG_SHIFT) - 1;
const CLEAN_TAG_MASK: u64 = 0xffff;

/// How long a group writer polls for the writer lock before it sleeps
/// ([`HashEngine::group_writer`]): about the longest publish of a group
/// ([`super::table::GROUP_MAX`] puts at a microsecond or so each).
pub const GROUP_LOCK_SPIN: Duration = Duration::from_micros(100);

/// A hash pool opened by `Db`.
pub struct HashEngine<S: Space> {
    pub space: Arc<S>,
    pub alloc: Arc<Allocator>,
    pub table: HashTable<S>,
    pub index: Index<()>,
    /// Whether the ordered index is kept (`Options::ordered_index`).
    indexed: bool,
    /// A read-only open of a cleanly closed pool: the saved image's block,
    /// used though the table does not reach it (`check` counts it).
    image: Option<u64>,
    writer: Mutex<()>,
    /// Hash pools keep no versions: this clock never advances (it is there
    /// so `Db::clock` answers on every engine).
    pub clock: Clock,
    /// Tree counters, all zero on a hash pool (`Db::tree_stats`).
    pub stats: TreeStats,
}

impl<S: Space> HashEngine<S> {
    /// An empty table published at the header's hash root word. Called
    /// before the header is written, so a pool whose creation crashed is
    /// either "not a pool" or a pool with a whole, empty table.
    pub fn create(space: Arc<S>, alloc: Arc<Allocator>, indexed: bool) -> Result<HashEngine<S>> {
        let table = HashTable::create(space.clone(), alloc.clone(), header::hash_root_word())?;
        Ok(HashEngine {
            space,
            alloc,
            table,
            index: Index::with_leaves(index::ORDER, index::LEAF),
            indexed,
            image: None,
            writer: Mutex::new(()),
            clock: Clock::new(0),
            stats: TreeStats::default(),
        })
    }

    /// Opens the table of a pool whose header has been validated: scan and
    /// validate it, load the saved index image (or rebuild the index when
    /// there is none or it does not validate), rebuild the allocator by
    /// reachability. On a writable open the clean word is cleared first
    /// (before any other write), as on tree pools; the image's block is then
    /// free. Without `indexed`, no index is loaded or built.
    pub fn open(space: Arc<S>, h: &Header, indexed: bool) -> Result<(HashEngine<S>, Recovery)> {
        let t = Instant::now();
        let s = &*space;
        let mut scan = HashTable::recover(s, header::hash_root_word())?;
        let clean = header::clean_state(s);
        let loaded = if clean > CLEAN_MARK {
            load_image(s, clean, h.data_start, &scan.reachable, scan.len())
        } else {
            None
        };
        // A read-only open leaves the image in place: its block stays used.
        let image = match &loaded {
            Some(_) if !s.writable() => {
                let off = clean & CLEAN_OFFSET_MASK;
                scan.reachable.insert(off);
                Some(off)
            }
            _ => None,
        };
        let alloc = Arc::new(Allocator::rebuild(s, h.chunk_size, h.data_start, &scan.reachable)?);
        if let Some(off) = image {
            scan.reachable.remove(&off);
        }
        if s.writable() && clean != 0 {
            header::set_clean_state(s, 0);
        }
        let table = HashTable::open(space.clone(), alloc.clone(), header::hash_root_word(), scan);
        let (index, kind) = match loaded {
            Some(keys) if indexed => (
                Index::from_sorted(index::ORDER, index::LEAF, keys.into_iter().map(|k| (k, ()))),
                RecoveryKind::Loaded,
            ),
            Some(_) => (Index::with_leaves(index::ORDER, index::LEAF), RecoveryKind::Loaded),
            None if indexed => (
                Index::rebuild(&table, index::ORDER, index::LEAF, |_, _| ()),
                RecoveryKind::Rebuild,
            ),
            None => (Index::with_leaves(index::ORDER, index::LEAF), RecoveryKind::Rebuild),
        };
        let engine = HashEngine {
            space,
            alloc,
            table,
            index,
            indexed,
            image,
            writer: Mutex::new(()),
            clock: Clock::new(0),
            stats: TreeStats::default(),
        };
        let recovery = Recovery {
            kind,
            millis: t.elapsed().as_secs_f64() * 1e3,
        };
        Ok((engine, recovery))
    }

    /// Lends the value of `key` to `f` in place (see [`HashTable::get_with`]).
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        crate::tree::check_key(key)?;
        Ok(self.table.get_with(key, f))
    }

    /// [`HashEngine::get_with`] for each of `keys` as one batch (see
    /// [`HashTable::get_many_with`]): `f(i, value)` once for each `keys[i]`;
    /// a key that is not valid gets its error (before the valid ones).
    pub fn get_many_with(&self, keys: &[&[u8]], mut f: impl FnMut(usize, Result<Option<&[u8]>>)) {
        let mut valid = Vec::with_capacity(keys.len());
        let mut at = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            match crate::tree::check_key(k) {
                Ok(()) => {
                    valid.push(*k);
                    at.push(i);
                }
                Err(e) => f(i, Err(e)),
            }
        }
        self.table.get_many_with(&valid, |j, v| f(at[j], Ok(v)));
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        crate::tree::check_sizes(key, value)?;
        // The value is copied into the pool before the writer lock, so
        // concurrent puts copy in parallel (see `HashTable::write_blob`),
        // while the lines the put reads and writes under the lock are
        // fetched (see `HashTable::prefetch_buckets`).
        let h = self.table.hash(key);
        self.table.prefetch_buckets(h);
        let blob = self.table.write_blob(key, value, super::points::BLOB_FLUSH)?;
        let _w = self.writer.lock();
        let mut index = self.index_writer();
        self.table
            .put_blob(h, key, value, blob, |k| insert_new(&mut index, k))?;
        Ok(())
    }

    /// The index's writer lock, taken under the engine's writer lock for a
    /// write that may add keys (`None` on a pool kept without the index).
    ///
    /// The table hands each key it adds to [`insert_new`] once the key's
    /// slot is written and its flush issued, before the fence that orders
    /// that flush (`HashTable::put_blob`, `HashTable::put_group_blobs`).
    /// That fence waits for the flushed line to reach memory; the index's
    /// insert (a descent through DRAM nodes, mostly cache misses, and an
    /// append) runs while it does, instead of after the put's last fence.
    /// It took about 40% off what the index adds to a put
    /// (BENCHMARKS.md, "The index insert inside the slot's flush").
    ///
    /// - Index changes come in the order of the table changes they follow:
    ///   a write takes the index's lock under the engine's, and holds it
    ///   until its index change is done (a group lets go of the engine's
    ///   lock first, see [`HashEngine::put_group`]).
    /// - A range can meet the key in the index before the table publishes
    ///   it. It then finds no value and skips the key, as it skips a key
    ///   deleted meanwhile. A put never fails once its slot is written, so
    ///   the index never names a key that the table does not get.
    /// - Anything that reads the table and the index as one (`check`,
    ///   `close_clean`) holds both locks.
    fn index_writer(&self) -> Option<index::Writer<'_, ()>> {
        self.indexed.then(|| self.index.writer())
    }

    /// Stores every pair of `pairs` as one durable group (see
    /// [`HashTable::put_group`]): one result per pair, in order; every put
    /// that succeeded is durable when this returns, and the index names
    /// its key.
    pub fn put_group(&self, pairs: &[(&[u8], &[u8])]) -> Vec<Result<()>> {
        let mut out: Vec<Result<()>> = pairs.iter().map(|(k, v)| crate::tree::check_sizes(k, v)).collect();
        let valid: Vec<(&[u8], &[u8])> = pairs
            .iter()
            .zip(&out)
            .filter(|(_, r)| r.is_ok())
            .map(|(p, _)| *p)
            .collect();
        if valid.is_empty() {
            return out;
        }
        let hashes = self.table.hashes(&valid);
        let blobs = self.table.write_blobs(&valid, &hashes);
        // Wait for the blobs' write-back here, not under the lock: the
        // group's slot fence orders them (the drain means nothing to the
        // crash model), and finds them done. With two writers, one writes
        // its blobs back while the other holds the lock.
        self.space.drain();
        let w = self.group_writer();
        let mut fresh: Vec<&[u8]> = Vec::with_capacity(valid.len());
        let done = self.table.put_group_blobs(&valid, &hashes, blobs, |k| fresh.push(k));
        // The group's new keys go into the index once the engine's writer
        // lock is let go, so that the next group's table work runs beside
        // these inserts instead of after them (a group has one fence for
        // all its slots, so there is no flush to hide them in, as a single
        // put does). The index's writer lock is taken before the engine's
        // is let go: every later write that changes the index takes it
        // after this, so index changes keep the order of the table changes
        // they follow (see `HashEngine::index_writer`).
        let mut index = self.index_writer();
        drop(w);
        for k in fresh {
            insert_new(&mut index, k);
        }
        let mut done = done.into_iter();
        for r in out.iter_mut().filter(|r| r.is_ok()) {
            *r = done.next().expect("one result per valid pair").map(|_| ());
        }
        out
    }

    /// The writer lock for a group's publish ([`HashEngine::put_group`]),
    /// polled for up to [`GROUP_LOCK_SPIN`] before the thread sleeps on
    /// it. Group writers are the async workers, which take turns at the
    /// lock, each holding it for one group's publish (tens of
    /// microseconds). One that sleeps waits for the holder's wake-up on
    /// top, several microseconds more on a virtual machine, during which
    /// nobody holds the lock; polling hands it over as it is released.
    /// (With two workers on two cores, `bench kvindex` at one sector went
    /// from about 0.8x the sync rate to about 1.0x; BENCHMARKS.md.)
    fn group_writer(&self) -> parking_lot::MutexGuard<'_, ()> {
        let until = Instant::now() + GROUP_LOCK_SPIN;
        loop {
            if let Some(g) = self.writer.try_lock() {
                return g;
            }
            if Instant::now() >= until {
                return self.writer.lock();
            }
            std::hint::spin_loop();
        }
    }

    /// Writes only over a key that exists (the ordered index already holds it).
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        crate::tree::check_sizes(key, value)?;
        // Fetched while the lock is waited for (see `HashEngine::put`);
        // the key is hashed once for the prefetch, the lookup and the put.
        let h = self.table.hash(key);
        self.table.prefetch_buckets(h);
        let _w = self.writer.lock();
        if !self.table.contains_hashed(h, key) {
            return Ok(false);
        }
        let blob = self.table.write_blob(key, value, super::points::BLOB_FLUSH)?;
        self.table.put_blob(h, key, value, blob, |_| {})?;
        Ok(true)
    }

    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        crate::tree::check_key(key)?;
        let _w = self.writer.lock();
        let removed = self.table.delete(key);
        if removed && self.indexed {
            self.index.remove(key);
        }
        Ok(removed)
    }

    pub fn len(&self) -> u64 {
        self.table.len()
    }

    /// Reads the table back and validates it without writing.
    pub fn validate(&self) -> Result<()> {
        let _w = self.writer.lock();
        self.table.scan().map(|_| ())
    }

    /// `nvstore check` on a hash pool: the table reads back valid, the
    /// index holds exactly the table's keys and keeps its B+-tree
    /// invariants, the key count matches, and every block is either
    /// reachable from the table or free (no leak, no double use).
    pub fn check(&self, h: &Header, path: &std::path::Path) -> CheckReport {
        let _w = self.writer.lock();
        let _iw = self.index.writer();
        let mut r = CheckReport::default();
        let mut problems = Vec::new();
        let scan = match self.table.scan() {
            Ok(scan) => scan,
            Err(e) => {
                r.problems.push(e.at(path).to_string());
                return r;
            }
        };
        let mut table_keys = Vec::new();
        self.table.for_each(|k, _| table_keys.push(k.to_vec()));
        table_keys.sort_unstable();
        if table_keys.windows(2).any(|w| w[0] == w[1]) {
            problems.push("the table lists a key twice".into());
        }
        let index_keys: Vec<Vec<u8>> = self.index.range(RB::Unbounded, RB::Unbounded).map(|(k, _)| k).collect();
        if self.indexed && index_keys != table_keys {
            let first = index_keys.iter().zip(&table_keys).position(|(a, b)| a != b);
            problems.push(format!(
                "the ordered index ({} keys) differs from the table ({} keys), first at position {:?}",
                index_keys.len(),
                table_keys.len(),
                first
            ));
        }
        if let Err(e) = self.index.check() {
            problems.push(format!("ordered index: {e}"));
        }
        r.keys = table_keys.len() as u64;
        r.elements = r.keys;
        if scan.len() != self.table.len() || scan.len() != r.keys {
            problems.push(format!(
                "key count {} differs from the {} keys the table holds ({} listed)",
                self.table.len(),
                scan.len(),
                r.keys
            ));
        }
        r.blobs = scan.blobs;
        let mut reachable = scan.reachable;
        if let Some(off) = self.image {
            reachable.insert(off);
        }
        r.reachable_blocks = reachable.len() as u64;
        problems.extend(self.alloc.verify(&*self.space, &reachable));
        r.used_bytes = self.alloc.used_bytes() + h.data_start;
        r.ok = problems.is_empty();
        r.problems = problems;
        r
    }

    /// Saves the ordered index's keys into a block ([`save_image`]) and
    /// marks the pool cleanly closed with the block's offset (one root
    /// store), then syncs. With no index kept nothing is saved and the
    /// mark is [`CLEAN_MARK`].
    pub fn close_clean(&self) -> Result<()> {
        let _w = self.writer.lock();
        let _iw = self.index.writer();
        let s = &*self.space;
        let word = if self.indexed {
            save_image(s, &self.alloc, &self.index)?
        } else {
            CLEAN_MARK
        };
        header::set_clean_state(s, word);
        self.space.sync()
    }

    /// Pairs with keys between `lo` and `hi`, in key order or reversed.
    pub fn range(self: &Arc<Self>, lo: RB<Vec<u8>>, hi: RB<Vec<u8>>, reverse: bool) -> HashIter<S> {
        HashIter {
            engine: self.clone(),
            keys: self.keys(&lo, &hi, reverse),
            error: (!self.indexed).then(no_index),
            reported: false,
        }
    }

    /// The ordered index's keys in `lo..hi` (descending with `reverse`);
    /// `None` on a pool kept without the index.
    fn keys(&self, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>, reverse: bool) -> Option<index::Iter<()>> {
        fn b(x: &RB<Vec<u8>>) -> RB<&[u8]> {
            x.as_ref().map(Vec::as_slice)
        }
        if !self.indexed {
            None
        } else if reverse {
            Some(self.index.range_rev(b(lo), b(hi)))
        } else {
            Some(self.index.range(b(lo), b(hi)))
        }
    }
}

impl<S: Space> HashEngine<S> {
    /// Calls `f` on each pair between `lo` and `hi` (as [`HashEngine::range`]
    /// yields them) until it breaks.
    pub fn scan_with(
        self: &Arc<Self>,
        lo: RB<Vec<u8>>,
        hi: RB<Vec<u8>>,
        reverse: bool,
        mut f: impl FnMut(&[u8], &[u8]) -> std::ops::ControlFlow<()>,
    ) -> Result<()> {
        let keys = self.keys(&lo, &hi, reverse).ok_or_else(no_index)?;
        // Each value is lent where it lies (`HashTable::get_with`), not
        // copied out; a key removed since the index named it is skipped.
        for (k, ()) in keys {
            if self.table.get_with(&k, |v| f(&k, v)).is_some_and(|c| c.is_break()) {
                break;
            }
        }
        Ok(())
    }
}

/// A range over a hash pool: keys from one snapshot of the index, values
/// from the table. Without an index it yields nothing and keeps the
/// `Unsupported` error ([`HashIter::error`]).
pub struct HashIter<S: Space> {
    engine: Arc<HashEngine<S>>,
    keys: Option<index::Iter<()>>,
    error: Option<Error>,
    reported: bool,
}

impl<S: Space> HashIter<S> {
    /// Why the range yields nothing, if it cannot be served.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// The next pair, or (once) the error that stops the range.
    pub fn next_checked(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        if self.error.is_some() {
            if self.reported {
                return None;
            }
            self.reported = true;
            return Some(Err(no_index()));
        }
        self.next().map(Ok)
    }
}

impl<S: Space> Iterator for HashIter<S> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<Self::Item> {
        for (k, ()) in self.keys.as_mut()?.by_ref() {
            if let Some(v) = self.engine.table.get(&k) {
                return Some((k, v));
            }
        }
        None
    }
}

/// A range or prefix on a hash pool opened without its ordered index.
fn no_index() -> Error {
    Error::Unsupported(
        "range and prefix queries on a hash pool need its ordered index, which this open left out \
         (open with Options::ordered_index on)"
            .into(),
    )
}

/// Inserts `key`, which the table has just added, through the index's
/// writer lock when the pool keeps the index ([`HashEngine::index_writer`]).
fn insert_new(index: &mut Option<index::Writer<'_, ()>>, key: &[u8]) {
    if let Some(w) = index {
        w.insert_new(key, ());
    }
}

/// Writes `index`'s keys, in order, sealed into a new block, and flushes
/// it (`hash.image.flush`; the clean word's fence orders it). Returns the
/// clean word that names it.
fn save_image<S: Space>(s: &S, alloc: &Allocator, index: &Index<()>) -> Result<u64> {
    let mut body = vec![IMAGE_TAG, index.len()];
    for (k, ()) in index.range(RB::Unbounded, RB::Unbounded) {
        saved::put_bytes(&mut body, &k);
    }
    let sealed = saved::seal(&body);
    let bytes: Vec<u8> = sealed.iter().flat_map(|w| w.to_le_bytes()).collect();
    let off = alloc.alloc(s, bytes.len() as u64)?;
    s.write(off, &bytes);
    s.flush(off, bytes.len() as u64, super::points::IMAGE_FLUSH);
    Ok(off | (sealed[saved::CRC_W] & CLEAN_TAG_MASK) << CLEAN_TAG_SHIFT)
}

/// The keys of the image the clean word `clean` names, if it is whole
/// (magic, length, checksum, tag), lies outside every block the table
/// reaches, holds strictly ascending keys and as many as the table (`len`).
fn load_image<S: Space>(
    s: &S,
    clean: u64,
    data_start: u64,
    reachable: &std::collections::BTreeSet<u64>,
    len: u64,
) -> Option<Vec<Vec<u8>>> {
    let (at, tag) = (clean & CLEAN_OFFSET_MASK, clean >> CLEAN_TAG_SHIFT);
    let pool = s.size();
    if !at.is_multiple_of(crate::pmem::LINE) || at < data_start || reachable.contains(&at) {
        return None;
    }
    if at.checked_add(saved::BODY_W as u64 * 8)? > pool || s.read_u64(at) != saved::MAGIC {
        return None;
    }
    let words = s.read_u64(at + 8);
    if words < saved::BODY_W as u64 + 2 || words > (pool - at) / 8 {
        return None;
    }
    let mut bytes = vec![0u8; words as usize * 8];
    s.read(at, &mut bytes);
    let all: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let body = saved::open(&all)?;
    if all[saved::CRC_W] & CLEAN_TAG_MASK != tag || body[0] != IMAGE_TAG || body[1] != len {
        return None;
    }
    let mut it = body[2..].iter().copied();
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(len.min(1 << 24) as usize);
    for _ in 0..len {
        let k = saved::get_bytes(&mut it)?;
        if keys.last().is_some_and(|p| *p >= k) {
            return None;
        }
        keys.push(k);
    }
    it.next().is_none().then_some(keys)
}

/// The error tree-only features give on a hash pool: what is missing,
/// why, and what to do instead.
pub fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what} need a tree pool: a hash pool keeps one version of each key and has no \
         multi-key commit. Use a tree pool (nvstore create POOL --engine tree), copying the \
         data over with `nvstore dump HASH_POOL | nvstore load POOL -`"
    ))
}
