//! The persistent hash table: extendible hashing over segments of buckets
//! (CCEH, Dash), one 8-byte publish per write, splits by copy-on-write.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

use super::layout::{self as l, BucketHeader, KeyHash, Meta, Slot};
use super::points as p;
use crate::alloc::Allocator;
use crate::error::{Error, Result};
use crate::format::blob;
use crate::pmem::{Point, Space, LINE};
use crate::tree::SplitHook;

/// Longest key or value: blob lengths are 32-bit.
pub const MAX_LEN: usize = u32::MAX as usize;

/// Most lines of one blob that [`HashTable::get_many_with`] fetches ahead
/// (1 KiB): a longer value streams in as it is copied, which the
/// hardware's own prefetcher follows well, and a batch of such values
/// would evict its own early lines before they are read.
pub const PREFETCH_BLOB_LINES: u64 = 16;

/// A put's blob, written and flushed but named by no slot yet
/// ([`HashTable::write_blob`]): its offset, 0 when the key and value fit
/// in the slot. The put it was written for publishes it or frees it.
#[derive(Clone, Copy, Debug)]
#[must_use = "a written blob is published by a put or freed by discard"]
pub struct Blob(u64);

/// DRAM mirror of the published directory, and counters.
#[derive(Clone, Debug)]
struct State {
    dir: u64,
    depth: u32,
    /// The directory's entries, shared with [`HashTable::hint`]: changed
    /// only under the writer lock, read without it by the prefetch.
    entries: Entries,
    len: u64,
    next_version: u64,
}

/// What [`HashTable::recover`] found in the pool: the table's state and
/// every block it references (for the allocator's reachability rebuild).
#[derive(Debug)]
pub struct Scan {
    state: State,
    /// The hash the table's directory names.
    key_hash: KeyHash,
    /// The directory, every segment and every blob of a published slot.
    pub reachable: BTreeSet<u64>,
    /// Blobs among them.
    pub blobs: u64,
}

impl Scan {
    /// Distinct keys.
    pub fn len(&self) -> u64 {
        self.state.len
    }
}

/// A published slot holding the key looked for.
#[derive(Clone, Copy, Debug)]
struct Found {
    bucket: u64,
    slot: usize,
    words: Slot,
    meta: Meta,
}

/// A persistent hash table in the pool, rooted at one 8-byte word.
///
/// Writers are serialised by the lock; readers share it. Blocks a write
/// unlinks are freed at once, which the lock makes safe (no reader can hold
/// them).
pub struct HashTable<S: Space> {
    space: Arc<S>,
    alloc: Arc<Allocator>,
    root_off: u64,
    /// The hash the table places its keys by (named in its directory).
    key_hash: KeyHash,
    state: RwLock<State>,
    /// Segment splits since open (`stat`'s `splits` on a hash pool).
    splits: AtomicU64,
    /// Called right after a split frees the old segment and directory
    /// (crash tests: the moment another writer's `write_blob` may first
    /// take those blocks).
    split_hook: Mutex<Option<SplitHook>>,
    /// The directory's entries as [`HashTable::prefetch_buckets`] reads
    /// them without the lock: the same array as the state's, swapped for
    /// the new one when the directory doubles (a split stores its entries
    /// into it in place). A reader may see it one change behind, which
    /// only costs a wasted prefetch.
    hint: ArcSwap<Box<[AtomicU64]>>,
}

/// The directory's entries in DRAM: atomic words, so that the prefetch
/// can read them while a split stores into them.
type Entries = Arc<Box<[AtomicU64]>>;

fn entries_of(entries: &[u64]) -> Entries {
    Arc::new(entries.iter().map(|&e| AtomicU64::new(e)).collect())
}

impl State {
    /// Directory entry `j`.
    fn entry_at(&self, j: usize) -> u64 {
        self.entries[j].load(Ordering::Relaxed)
    }

    /// The directory entry of a key with table hash `h`.
    fn entry(&self, h: u64) -> u64 {
        self.entry_at(l::dir_index(h, self.depth) as usize)
    }

    fn all_entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|e| e.load(Ordering::Relaxed))
    }
}

impl<S: Space> HashTable<S> {
    /// Creates an empty table (one segment, global depth 0) that places
    /// its keys by [`KeyHash::NEW`] and publishes it at `root_off`, which
    /// must hold 0.
    pub fn create(space: Arc<S>, alloc: Arc<Allocator>, root_off: u64) -> Result<Self> {
        Self::create_with(space, alloc, root_off, KeyHash::NEW)
    }

    /// [`HashTable::create`] with the hash `key_hash` (tests make tables
    /// of the older hash with it, as pools written before it hold).
    pub fn create_with(space: Arc<S>, alloc: Arc<Allocator>, root_off: u64, key_hash: KeyHash) -> Result<Self> {
        let seg = alloc.alloc(&*space, l::SEGMENT_BYTES)?;
        let dir = match alloc.alloc(&*space, l::dir_bytes(0)) {
            Ok(d) => d,
            Err(e) => {
                alloc.free(seg);
                return Err(e);
            }
        };
        space.zero(seg, l::SEGMENT_BYTES);
        space.flush(seg, l::SEGMENT_BYTES, p::SEGMENT_FLUSH);
        let entry = l::dir_entry(seg, 0);
        space.store(dir, l::dir_word0(0, key_hash));
        space.store(dir + 8, entry);
        space.flush(dir, l::dir_bytes(0), p::DIR_FLUSH);
        space.fence(p::SPLIT_FENCE);
        space.publish(root_off, dir, p::ROOT_FLUSH, p::ROOT_FENCE);
        let state = State {
            dir,
            depth: 0,
            entries: entries_of(&[entry]),
            len: 0,
            next_version: 1,
        };
        Ok(HashTable {
            space,
            alloc,
            root_off,
            key_hash,
            hint: ArcSwap::new(state.entries.clone()),
            state: RwLock::new(state),
            splits: AtomicU64::new(0),
            split_hook: Mutex::new(None),
        })
    }

    /// Reads and validates the table rooted at `root_off` without writing:
    /// the directory's shape, every published slot (metadata, blob, and
    /// that its key hashes to where it is stored). Any violation is
    /// `Error::Corrupt`. Needs no allocator, so the caller can rebuild the
    /// allocator from [`Scan::reachable`] and then [`HashTable::open`].
    pub fn recover(space: &S, root_off: u64) -> Result<Scan> {
        let corrupt = |what: String| Error::corrupt(format!("hash table: {what}"));
        let size = space.size();
        let in_pool = |off: u64, len: u64| {
            off != 0 && off.is_multiple_of(LINE) && off.checked_add(len).is_some_and(|e| e <= size)
        };
        let dir = space.load(root_off);
        if !in_pool(dir, 8) {
            return Err(corrupt(format!("root {dir} is not a directory")));
        }
        let w0 = space.load(dir);
        let depth = (w0 & 0xffff_ffff) as u32;
        let shape_ok = depth <= l::MAX_DEPTH && in_pool(dir, l::dir_bytes(depth));
        let Some(key_hash) = KeyHash::from_word0(w0).filter(|_| shape_ok) else {
            return Err(corrupt(format!("directory at {dir} has a bad first word {w0:#x}")));
        };
        let mut entries: Vec<u64> = (0..1u64 << depth).map(|j| space.load(dir + 8 + 8 * j)).collect();
        if let Some((first, span, e)) = torn_split(&entries, depth) {
            // A split that kept the depth crashed while its entries were
            // being stored: name the old segment again throughout its run
            // (it holds every entry of both halves; the halves become
            // unreachable and the allocator's rebuild frees them). Persisted
            // on a writable open; a read-only one reads it so in memory.
            entries[first..first + span].fill(e);
            if space.writable() {
                store_entries(space, dir, first, &entries[first..first + span]);
            }
        }
        let mut reachable = BTreeSet::from([dir]);
        let mut segments = Vec::new();
        let mut j = 0usize;
        while j < entries.len() {
            let e = entries[j];
            let (seg, local) = (l::entry_seg(e), l::entry_depth(e));
            if local > depth || !in_pool(seg, l::SEGMENT_BYTES) {
                return Err(corrupt(format!("directory entry {j} ({e:#x}) is invalid")));
            }
            let span = 1usize << (depth - local);
            if !j.is_multiple_of(span) || entries[j..j + span].iter().any(|&x| x != e) {
                return Err(corrupt(format!(
                    "directory entries of segment {seg} are not one aligned run at {j}"
                )));
            }
            if !reachable.insert(seg) {
                return Err(corrupt(format!("segment {seg} appears twice in the directory")));
            }
            segments.push((seg, local, (j >> (depth - local)) as u64));
            j += span;
        }
        let mut len = 0;
        let mut blobs = 0;
        let mut max_version = 0;
        for (seg, local, pattern) in segments {
            let mut newest: HashMap<Vec<u8>, u64> = HashMap::new();
            for b in 0..l::SEGMENT_BUCKETS {
                let bo = l::bucket_off(seg, b);
                let hdr = BucketHeader(space.load(bo));
                if !hdr.well_formed() {
                    return Err(corrupt(format!("bucket {bo} has a bad header {:#x}", hdr.0)));
                }
                for i in (0..l::BUCKET_SLOTS).filter(|&i| hdr.valid(i)) {
                    let so = bo + l::slot_rel(i);
                    let words = read_slot(space, so);
                    let meta = Meta::decode(words[3])
                        .ok_or_else(|| corrupt(format!("slot {so} is published but holds no entry")))?;
                    if meta.needs_blob() {
                        validate_blob(space, words[1], meta, size).map_err(|w| corrupt(format!("slot {so}: {w}")))?;
                        if !reachable.insert(words[1]) {
                            return Err(corrupt(format!("blob {} is referenced twice", words[1])));
                        }
                        blobs += 1;
                    }
                    let key = slot_key(space, &words, meta);
                    let h = key_hash.of(&key);
                    if meta.key_inline.is_none() && words[0] != 0 && words[0] != h {
                        return Err(corrupt(format!("slot {so} keeps a hash that is not its key's")));
                    }
                    let home = l::home_bucket(h);
                    let placed = (0..l::PROBE).any(|d| (home + d) % l::SEGMENT_BUCKETS == b);
                    let mine = local == 0 || h >> (64 - local) == pattern;
                    if !placed || !mine || hdr.fp(i) != l::fingerprint(h) {
                        return Err(corrupt(format!("slot {so} holds a key that does not hash there")));
                    }
                    max_version = max_version.max(meta.version);
                    newest.insert(key, meta.version);
                }
            }
            len += newest.len() as u64;
        }
        Ok(Scan {
            key_hash,
            state: State {
                dir,
                depth,
                entries: entries_of(&entries),
                len,
                next_version: max_version + 1,
            },
            reachable,
            blobs,
        })
    }

    /// Opens a recovered table with the pool's (rebuilt) allocator.
    pub fn open(space: Arc<S>, alloc: Arc<Allocator>, root_off: u64, scan: Scan) -> Self {
        HashTable {
            space,
            alloc,
            root_off,
            key_hash: scan.key_hash,
            hint: ArcSwap::new(scan.state.entries.clone()),
            state: RwLock::new(scan.state),
            splits: AtomicU64::new(0),
            split_hook: Mutex::new(None),
        }
    }

    /// Number of distinct keys.
    pub fn len(&self) -> u64 {
        self.state.read().len
    }

    /// The hash the table places its keys by.
    pub fn key_hash(&self) -> KeyHash {
        self.key_hash
    }

    /// The table hash of `key`: where it lives, its fingerprint, and what
    /// a slot keeps for a key out of line.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.key_hash.of(key)
    }

    /// The table hash ([`HashTable::hash`]) of each pair's key, in order:
    /// a group's puts compute them once, before any lock, and hand them to
    /// [`HashTable::write_blobs`] and [`HashTable::put_group_blobs`].
    pub fn hashes(&self, items: &[(&[u8], &[u8])]) -> Vec<u64> {
        items.iter().map(|(key, _)| self.hash(key)).collect()
    }

    /// Installs (or removes) the split hook. For crash tests only: a hook
    /// that writes blobs stands for concurrent writers, whose blobs may
    /// take the blocks a split has just freed.
    #[cfg(test)]
    pub fn set_split_hook(&self, hook: Option<SplitHook>) {
        *self.split_hook.lock() = hook;
    }

    /// Segment splits since the table was created or opened.
    pub fn splits(&self) -> u64 {
        self.splits.load(Ordering::Relaxed)
    }

    /// Global depth of the directory (for tests and `stat`).
    pub fn depth(&self) -> u32 {
        self.state.read().depth
    }

    /// Whether `key`, of table hash `h` (the caller's, computed once for
    /// the whole operation), has an entry, without copying its value out.
    pub fn contains_hashed(&self, h: u64, key: &[u8]) -> bool {
        let st = self.state.read();
        self.find_newest(&st, h, key).is_some()
    }

    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.get_with(key, <[u8]>::to_vec)
    }

    /// Lends the newest value of `key` to `f` where it lies (in its slot or
    /// its blob), without copying it out: a read allocates nothing. `f`
    /// runs under the table's read lock (writers wait meanwhile, and no
    /// blob a reader can reach is freed), so it should be short and must
    /// not call into the table again (the lock is not reentrant).
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let st = self.state.read();
        let newest = self.find_newest(&st, self.hash(key), key)?;
        Some(with_slot_value(&*self.space, &newest.words, newest.meta, f))
    }

    /// [`HashTable::get_with`] for each of `keys`, under one hold of the
    /// read lock: `f(i, value)` with the newest value of `keys[i]` (or
    /// `None`), in order. The lookups overlap their cache misses, which
    /// lone gets take one after the other. In stages over the whole batch,
    /// each giving the lines the stage before asked for time to arrive:
    /// 1. fetch the bucket lines of every key;
    /// 2. fetch the first line of the blob of every slot whose fingerprint
    ///    matches (the lengths and the start of the key);
    /// 3. read those lengths and fetch the rest of each blob, up to
    ///    [`PREFETCH_BLOB_LINES`] lines;
    /// 4. look up each key as [`HashTable::get_with`] does and lend its
    ///    value.
    ///
    /// Stages 1-3 only warm lines: an offset that is stale or outside the
    /// pool is skipped, and the lookup reads as a lone get reads. Writers
    /// wait for the whole batch, so keep batches short (a few dozen).
    pub fn get_many_with(&self, keys: &[&[u8]], mut f: impl FnMut(usize, Option<&[u8]>)) {
        let st = self.state.read();
        let size = self.space.size();
        let hashes: Vec<u64> = keys.iter().map(|k| self.hash(k)).collect();
        for &h in &hashes {
            for line in bucket_lines(l::entry_seg(st.entry(h)), h) {
                self.space.prefetch(line);
            }
        }
        let mut blobs = Vec::with_capacity(keys.len());
        for &h in &hashes {
            let fp = l::fingerprint(h);
            let seg = l::entry_seg(st.entry(h));
            for b in (0..l::PROBE).map(|d| l::bucket_off(seg, l::home_bucket(h) + d)) {
                let hdr = BucketHeader(self.space.load(b));
                for i in (0..l::BUCKET_SLOTS).filter(|&i| hdr.valid(i) && hdr.fp(i) == fp) {
                    let blob = self.space.load(b + l::slot_rel(i) + 8);
                    if blob != 0 && blob.is_multiple_of(LINE) && blob.saturating_add(LINE) <= size {
                        self.space.prefetch(blob);
                        blobs.push(blob);
                    }
                }
            }
        }
        for &blob in &blobs {
            let (kl, vl) = blob::lens(self.space.load(blob));
            let end = blob::value_at(blob, kl)
                .saturating_add(vl)
                .min(blob + PREFETCH_BLOB_LINES * LINE)
                .min(size);
            for line in (blob + LINE..end).step_by(LINE as usize) {
                self.space.prefetch(line);
            }
        }
        for (i, (key, &h)) in keys.iter().zip(&hashes).enumerate() {
            match self.find_newest(&st, h, key) {
                Some(n) => with_slot_value(&*self.space, &n.words, n.meta, |v| f(i, Some(v))),
                None => f(i, None),
            }
        }
    }

    /// Inserts or replaces. One 8-byte bucket-header store publishes it:
    /// the new slot's bit set and, in the same word, the old slot's bit
    /// cleared. Only when the old entry's bucket is full does the new one go
    /// to the other bucket of the probe window; then the old copy is cleared
    /// by a second store, and a crash in between leaves two copies, of which
    /// readers and recovery take the newer version. Returns whether the key
    /// is new (it had no entry). The tests' shorthand: the engine writes
    /// the blob and calls [`HashTable::put_blob`] with the hash it has.
    #[cfg(test)]
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        let blob = self.write_blob(key, value, p::BLOB_FLUSH)?;
        self.put_blob(self.hash(key), key, value, blob, |_| {})
    }

    /// Starts fetching the lines a put of a key with table hash `h` reads
    /// and writes under the writer lock (the headers and slots of its two
    /// buckets), so those misses overlap the work before the lock (the
    /// blob's copy) instead of lengthening the time the lock is held:
    /// under the lock a put then mostly hits the cache, and two writers
    /// overlap more of their work. Takes no lock and reads nothing from
    /// the pool: the segment comes from [`HashTable::hint`], and a stale
    /// one (a split since) only warms lines that are not needed. A hint
    /// changes no contents; an offset outside the pool is skipped.
    pub fn prefetch_buckets(&self, h: u64) {
        if let Some(seg) = self.hinted_segment(h) {
            self.prefetch_segment_buckets(seg, h);
        }
    }

    /// The segment [`HashTable::hint`] names for table hash `h`, if it lies
    /// inside the pool (it may be stale).
    fn hinted_segment(&self, h: u64) -> Option<u64> {
        let hint = self.hint.load();
        let depth = hint.len().trailing_zeros();
        let seg = l::entry_seg(hint.get(l::dir_index(h, depth) as usize)?.load(Ordering::Relaxed));
        (seg != 0 && seg.saturating_add(l::SEGMENT_BYTES) <= self.space.size()).then_some(seg)
    }

    /// Prefetches for writing the lines of the two buckets of hash `h` in
    /// `seg`, a segment inside the pool.
    fn prefetch_segment_buckets(&self, seg: u64, h: u64) {
        for line in bucket_lines(seg, h) {
            self.space.prefetch_write(line);
        }
    }

    /// Whether [`HashTable::hint`] holds the directory's entries as the
    /// pool stores them (tests: the writer keeps it current through
    /// splits and doublings).
    #[cfg(test)]
    pub fn hint_is_current(&self) -> bool {
        let st = self.state.read();
        let hint = self.hint.load();
        hint.len() == 1 << st.depth
            && hint
                .iter()
                .enumerate()
                .all(|(j, h)| h.load(Ordering::Relaxed) == self.space.load(st.dir + 8 + 8 * j as u64))
    }

    /// Replaces [`HashTable::hint`] (tests: a hint naming blocks outside
    /// the pool must be harmless).
    #[cfg(test)]
    pub fn set_hint(&self, entries: &[u64]) {
        self.hint.store(entries_of(entries));
    }

    /// Writes and flushes the blob a put of `key`/`value` needs, before
    /// the put takes any lock: blobs are private until a slot names them,
    /// so concurrent writers copy their values in parallel and hold the
    /// writer lock only to place and publish their slots. The put's slot
    /// fence orders the blob's flush (at `point`). A crash before the slot
    /// is published leaves the blob unreachable, and the allocator's
    /// rebuild at open frees it; a put that fails frees it at once.
    pub fn write_blob(&self, key: &[u8], value: &[u8], point: Point) -> Result<Blob> {
        let block = self.alloc_blob(key, value)?;
        Ok(self.fill_blob(key, value, block, point))
    }

    /// Writes and flushes (at `point`) the blob of `key` and `value` into
    /// `block`, which [`HashTable::alloc_blob`] allocated for them.
    fn fill_blob(&self, key: &[u8], value: &[u8], block: Option<u64>, point: Point) -> Blob {
        Blob(match (block, l::blob_parts(key, value)) {
            (Some(off), Some((k, v))) => {
                blob::write(&*self.space, off, k, v, point);
                off
            }
            _ => 0,
        })
    }

    /// Checks the lengths of `key` and `value` and allocates the block
    /// their blob needs (`None` when both are inline), unwritten.
    fn alloc_blob(&self, key: &[u8], value: &[u8]) -> Result<Option<u64>> {
        check_lens(key, value)?;
        l::blob_parts(key, value)
            .map(|(k, v)| self.alloc.alloc(&*self.space, blob::size(k.len(), v.len())))
            .transpose()
    }

    /// [`HashTable::put`] of a pair whose blob [`HashTable::write_blob`]
    /// has written, `h` being the key's table hash ([`HashTable::hash`], which the
    /// caller has computed for the prefetch). On an error the blob is freed.
    ///
    /// If the key is new, `on_new(key)` runs once its slot is written and
    /// the slot's flush issued, before the fence that orders the flush:
    /// the caller's DRAM work (the engine's index insert) then runs while
    /// the line is written back. Nothing after it can fail.
    pub fn put_blob(&self, h: u64, key: &[u8], value: &[u8], blob: Blob, on_new: impl FnMut(&[u8])) -> Result<bool> {
        let mut st = self.state.write();
        let r = self.put_locked(&mut st, h, key, value, blob, true, on_new);
        if r.is_err() {
            self.discard(blob);
        }
        r
    }

    /// Frees a blob no slot will name.
    pub fn discard(&self, blob: Blob) {
        if blob.0 != 0 {
            self.alloc.free(blob.0);
        }
    }

    /// [`HashTable::put`] with the writer lock held; marks the operation's
    /// end for the crash simulator when `boundary` (a put inside a group
    /// leaves that to the group).
    #[allow(clippy::too_many_arguments, reason = "one put's parameters, all distinct")]
    fn put_locked<'k>(
        &self,
        st: &mut State,
        h: u64,
        key: &'k [u8],
        value: &[u8],
        blob: Blob,
        boundary: bool,
        mut on_new: impl FnMut(&'k [u8]),
    ) -> Result<bool> {
        loop {
            let found = self.find_all(st, h, key);
            let seg = l::entry_seg(st.entry(h));
            let newest = found.iter().max_by_key(|f| f.meta.version);
            let window = (0..l::PROBE).map(|d| l::bucket_off(seg, l::home_bucket(h) + d));
            let target = newest.map(|f| f.bucket).into_iter().chain(window).find_map(|b| {
                let hdr = BucketHeader(self.space.load(b));
                hdr.free_slot().map(|i| (b, hdr, i))
            });
            let Some((b, hdr, i)) = target else {
                self.split(st, h)?;
                continue;
            };
            let so = self.write_slot(st, b, i, h, key, value, blob)?;
            self.space.flush(so, l::SLOT_BYTES, p::SLOT_FLUSH);
            if found.is_empty() {
                on_new(key);
            }
            self.space.fence(p::SLOT_FENCE);
            let mut new_hdr = hdr.with(i, l::fingerprint(h));
            for f in found.iter().filter(|f| f.bucket == b) {
                new_hdr = new_hdr.without(f.slot);
            }
            self.space.publish(b, new_hdr.0, p::BUCKET_FLUSH, p::BUCKET_FENCE);
            let others: Vec<Found> = found.iter().filter(|f| f.bucket != b).copied().collect();
            self.unpublish(&others);
            self.free_blobs(&found);
            st.next_version += 1;
            if found.is_empty() {
                st.len += 1;
            }
            if boundary {
                self.space.op_boundary();
            }
            return Ok(found.is_empty());
        }
    }

    /// [`HashTable::put_group_blobs`] with the blobs written first (the
    /// tests' shorthand; the engine takes its writer lock in between).
    #[cfg(test)]
    pub fn put_group(&self, items: &[(&[u8], &[u8])]) -> Vec<Result<bool>> {
        let hashes = self.hashes(items);
        self.put_group_blobs(items, &hashes, self.write_blobs(items, &hashes), |_| {})
    }

    /// The blobs of a group's puts ([`HashTable::write_blob`] of each), to
    /// write before any lock is taken; `hashes[i]` is the table hash of
    /// `items[i]`'s key ([`HashTable::hashes`]).
    pub fn write_blobs(&self, items: &[(&[u8], &[u8])], hashes: &[u64]) -> Vec<Result<Blob>> {
        debug_assert_eq!(items.len(), hashes.len());
        // Every block is allocated, and every key's segment read from the
        // hint, before the first blob is flushed. Both take locks (the
        // allocator's, and the hint's slot, given back when its guard
        // drops) with locked instructions, and a locked instruction after
        // a `clwb` waits for that line's write-back, as a fence would.
        // Done per put, they made each blob of a group wait for the one
        // before it to reach memory.
        let segs: Vec<Option<u64>> = hashes.iter().map(|&h| self.hinted_segment(h)).collect();
        let blocks: Vec<Result<Option<u64>>> = items.iter().map(|&(key, value)| self.alloc_blob(key, value)).collect();
        items
            .iter()
            .zip(blocks)
            .zip(hashes.iter().zip(segs))
            .map(|((&(key, value), block), (&h, seg))| {
                if let Some(seg) = seg {
                    self.prefetch_segment_buckets(seg, h);
                }
                Ok(self.fill_blob(key, value, block?, p::GROUP_BLOB_FLUSH))
            })
            .collect()
    }

    /// Inserts or replaces every pair of `items`, whose blobs
    /// [`HashTable::write_blobs`] has written (a pair whose blob failed
    /// fails with that error), as [`HashTable::put`] does, but as one
    /// durable group: each put's slot is written and flushed, then one fence (`hash.group.slot.fence`) orders
    /// them all, then every bucket header the group changes is stored and
    /// flushed, then one fence (`hash.group.bucket.fence`), after which
    /// every put of the group is durable. Each put is still published by
    /// one 8-byte header store, so a crash leaves each put of the group
    /// whole or absent, independently of the others (none is acknowledged
    /// before the last fence).
    ///
    /// Within a group:
    /// - a free slot is one whose bit is clear both in the pool and in the
    ///   group's pending header, so a slot the group clears (an older copy
    ///   of a key it updates) is not reused before that clear is durable;
    /// - blobs of replaced entries are freed only after the last fence, so
    ///   no put of the group can write over a blob a published slot still
    ///   names;
    /// - a put that needs more than one header store (a segment split, or
    ///   an update whose old copy is in the other bucket of the window), or
    ///   a key the group already holds, first completes the pending group,
    ///   then runs alone as [`HashTable::put`];
    /// - a group holds at most [`GROUP_MAX`] puts: a longer run of pairs is
    ///   published in groups of that many.
    ///
    /// Returns one result per pair, in order: whether the key was new, or
    /// why that put failed (it published nothing and its blob is freed;
    /// the others are not affected). `on_new` runs for each key the group
    /// adds, as in [`HashTable::put_blob`]: after that put's slot is
    /// written and flushed, before the fence that orders the flush; a put
    /// it ran for does not fail. The crash simulator sees one operation boundary, after
    /// the whole group.
    pub fn put_group_blobs<'k>(
        &self,
        items: &[(&'k [u8], &[u8])],
        hashes: &[u64],
        blobs: Vec<Result<Blob>>,
        mut on_new: impl FnMut(&'k [u8]),
    ) -> Vec<Result<bool>> {
        debug_assert_eq!(items.len(), hashes.len());
        let mut out = Vec::with_capacity(items.len());
        let mut st = self.state.write();
        let mut g = Group::default();
        for ((&(key, value), &h), blob) in items.iter().zip(hashes).zip(blobs) {
            if g.keys.len() >= GROUP_MAX {
                self.commit(&mut st, &mut g);
            }
            let blob = match blob {
                Ok(blob) => blob,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            let r = match self.stage(&mut st, &mut g, h, key, value, blob, &mut on_new) {
                Ok(Some(new)) => Ok(new),
                Ok(None) => {
                    self.commit(&mut st, &mut g);
                    self.put_locked(&mut st, h, key, value, blob, false, &mut on_new)
                }
                Err(e) => Err(e),
            };
            if r.is_err() {
                self.discard(blob);
            }
            out.push(r);
        }
        self.commit(&mut st, &mut g);
        self.space.op_boundary();
        out
    }

    /// Writes one put of a group into a free slot without publishing it
    /// (see [`HashTable::put_group`]). `None`: it cannot join the group
    /// (nothing was written). `h` is the key's table hash.
    #[allow(clippy::too_many_arguments, reason = "one put's parameters, all distinct")]
    fn stage<'k>(
        &self,
        st: &mut State,
        g: &mut Group<'k>,
        h: u64,
        key: &'k [u8],
        value: &[u8],
        blob: Blob,
        on_new: impl FnOnce(&'k [u8]),
    ) -> Result<Option<bool>> {
        if g.keys.iter().any(|&(kh, k)| kh == h && k == key) {
            return Ok(None);
        }
        let found = self.find_all(st, h, key);
        let seg = l::entry_seg(st.entry(h));
        let newest = found.iter().max_by_key(|f| f.meta.version);
        let window = (0..l::PROBE).map(|d| l::bucket_off(seg, l::home_bucket(h) + d));
        let target = newest.map(|f| f.bucket).into_iter().chain(window).find_map(|b| {
            let (hdr, busy) = match g.headers.iter().find(|p| p.0 == b) {
                Some(&(_, hdr, busy)) => (hdr, busy),
                None => {
                    let hdr = BucketHeader(self.space.load(b));
                    (hdr, hdr)
                }
            };
            BucketHeader(busy.0 | hdr.0).free_slot().map(|i| (b, hdr, busy, i))
        });
        let Some((b, hdr, busy, i)) = target else {
            return Ok(None);
        };
        if found.iter().any(|f| f.bucket != b) {
            return Ok(None);
        }
        let so = self.write_slot(st, b, i, h, key, value, blob)?;
        self.space.flush(so, l::SLOT_BYTES, p::GROUP_SLOT_FLUSH);
        if found.is_empty() {
            on_new(key);
        }
        let mut new_hdr = hdr.with(i, l::fingerprint(h));
        for f in &found {
            new_hdr = new_hdr.without(f.slot);
        }
        let busy = BucketHeader(busy.0 | new_hdr.0);
        match g.headers.iter_mut().find(|p| p.0 == b) {
            Some(p) => *p = (b, new_hdr, busy),
            None => g.headers.push((b, new_hdr, busy)),
        }
        g.replaced.extend(found.iter().copied());
        g.keys.push((h, key));
        st.next_version += 1;
        if found.is_empty() {
            g.new += 1;
        }
        Ok(Some(found.is_empty()))
    }

    /// Publishes the staged puts of `g` (see [`HashTable::put_group`]) and
    /// empties it.
    fn commit(&self, st: &mut State, g: &mut Group<'_>) {
        if g.headers.is_empty() {
            return;
        }
        self.space.fence(p::GROUP_SLOT_FENCE);
        for &(b, hdr, _) in &g.headers {
            self.space.store(b, hdr.0);
            self.space.flush(b, 8, p::GROUP_BUCKET_FLUSH);
        }
        self.space.fence(p::GROUP_BUCKET_FENCE);
        self.free_blobs(&g.replaced);
        st.len += g.new;
        g.headers.clear();
        g.replaced.clear();
        g.keys.clear();
        g.new = 0;
    }

    /// Removes `key`; returns whether it was present. Each bucket holding a
    /// copy is cleared by one store, the bucket with the newest copy last,
    /// so a crash never brings back an older value.
    pub fn delete(&self, key: &[u8]) -> bool {
        let mut st = self.state.write();
        let found = self.find_all(&st, self.hash(key), key);
        if found.is_empty() {
            return false;
        }
        self.unpublish(&found);
        self.free_blobs(&found);
        st.len -= 1;
        self.space.op_boundary();
        true
    }

    /// Calls `f` with every key and its newest value, in hash order (the
    /// full iteration that rebuilds the ordered index at open).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &[u8])) {
        let st = self.state.read();
        let mut seen = BTreeSet::new();
        for e in st.all_entries() {
            let seg = l::entry_seg(e);
            if !seen.insert(seg) {
                continue;
            }
            let mut newest: HashMap<Vec<u8>, Found> = HashMap::new();
            for found in self.segment_slots(seg) {
                let key = slot_key(&*self.space, &found.words, found.meta);
                match newest.get(&key) {
                    Some(old) if old.meta.version > found.meta.version => {}
                    _ => {
                        newest.insert(key, found);
                    }
                }
            }
            for (key, found) in newest {
                with_slot_value(&*self.space, &found.words, found.meta, |v| f(&key, v));
            }
        }
    }

    /// The table read back from the pool and validated, as at open (for
    /// `check` and `validate`; writers wait meanwhile).
    pub fn scan(&self) -> Result<Scan> {
        let _st = self.state.read();
        Self::recover(&*self.space, self.root_off)
    }

    /// Every block the table references, read back from the pool (for the
    /// allocator's `verify`).
    #[cfg(test)]
    pub fn reachable(&self) -> Result<BTreeSet<u64>> {
        Ok(self.scan()?.reachable)
    }

    /// Published slots holding `key` in its probe window.
    fn find_all(&self, st: &State, h: u64, key: &[u8]) -> Vec<Found> {
        let mut out = Vec::new();
        self.each_found(st, h, key, |f| out.push(f));
        out
    }

    /// The newest published slot holding `key` (a crash between the two
    /// stores of a move can leave two copies), found without allocating.
    fn find_newest(&self, st: &State, h: u64, key: &[u8]) -> Option<Found> {
        let mut newest: Option<Found> = None;
        self.each_found(st, h, key, |f| {
            if newest.is_none_or(|n| f.meta.version > n.meta.version) {
                newest = Some(f);
            }
        });
        newest
    }

    /// Calls `f` on each published slot holding `key` in its probe window.
    #[inline]
    fn each_found(&self, st: &State, h: u64, key: &[u8], mut f: impl FnMut(Found)) {
        let seg = l::entry_seg(st.entry(h));
        let fp = l::fingerprint(h);
        for d in 0..l::PROBE {
            let b = l::bucket_off(seg, l::home_bucket(h) + d);
            let hdr = BucketHeader(self.space.load(b));
            for i in (0..l::BUCKET_SLOTS).filter(|&i| hdr.valid(i) && hdr.fp(i) == fp) {
                let words = read_slot(&*self.space, b + l::slot_rel(i));
                let Some(meta) = Meta::decode(words[3]) else { continue };
                if slot_key_eq(&*self.space, &words, meta, key) {
                    f(Found {
                        bucket: b,
                        slot: i,
                        words,
                        meta,
                    });
                }
            }
        }
    }

    /// Every published slot of a segment: (bucket index, slot, entry, key).
    /// Clears the kept hash of every out-of-line key, as in a pool written
    /// before slots kept it (tests of reading such pools).
    #[cfg(test)]
    pub fn forget_key_hashes(&self) {
        let st = self.state.read();
        let segs: BTreeSet<u64> = st.all_entries().map(l::entry_seg).collect();
        for seg in segs {
            for f in self.segment_slots(seg).iter().filter(|f| f.meta.key_inline.is_none()) {
                let so = f.bucket + l::slot_rel(f.slot);
                self.space.store(so, 0);
                self.space.persist(so, 8, p::SLOT_FLUSH, p::SLOT_FENCE);
            }
        }
    }

    /// Every published entry of segment `seg`, without its key.
    fn segment_slots(&self, seg: u64) -> Vec<Found> {
        let mut out = Vec::new();
        for b in 0..l::SEGMENT_BUCKETS {
            let bo = l::bucket_off(seg, b);
            let hdr = BucketHeader(self.space.load(bo));
            for i in (0..l::BUCKET_SLOTS).filter(|&i| hdr.valid(i)) {
                let words = read_slot(&*self.space, bo + l::slot_rel(i));
                let Some(meta) = Meta::decode(words[3]) else { continue };
                out.push(Found {
                    bucket: bo,
                    slot: i,
                    words,
                    meta,
                });
            }
        }
        out
    }

    /// Clears the slots of `found`, one store per bucket, buckets in order
    /// of their newest copy (oldest first).
    fn unpublish(&self, found: &[Found]) {
        let mut buckets: Vec<(u64, u64)> = Vec::new(); // (newest version, bucket)
        for f in found {
            match buckets.iter_mut().find(|(_, b)| *b == f.bucket) {
                Some(e) => e.0 = e.0.max(f.meta.version),
                None => buckets.push((f.meta.version, f.bucket)),
            }
        }
        buckets.sort_unstable();
        for (_, b) in buckets {
            let mut hdr = BucketHeader(self.space.load(b));
            for f in found.iter().filter(|f| f.bucket == b) {
                hdr = hdr.without(f.slot);
            }
            self.space.publish(b, hdr.0, p::BUCKET_FLUSH, p::BUCKET_FENCE);
        }
    }

    /// Writes `key`'s entry, with the table's next version and its blob
    /// (written by [`HashTable::write_blob`]), into slot `i` of bucket `b`
    /// (not yet published: its header bit is the caller's, as are the
    /// slot's flush and fence), `h` being the key's table hash. Returns
    /// the slot's offset.
    #[allow(clippy::too_many_arguments, reason = "one slot's parameters, all distinct")]
    fn write_slot(&self, st: &State, b: u64, i: usize, h: u64, key: &[u8], value: &[u8], blob: Blob) -> Result<u64> {
        let version = st.next_version;
        if version > l::VERSION_MAX {
            return Err(Error::Unsupported("hash table: entry versions exhausted".into()));
        }
        debug_assert_eq!(h, self.hash(key), "a slot is written with its key's own hash");
        let words = l::encode_slot(key, value, blob.0, version, h);
        let so = b + l::slot_rel(i);
        self.space.write(so, &l::slot_to_bytes(&words));
        Ok(so)
    }

    fn free_blobs(&self, found: &[Found]) {
        for f in found.iter().filter(|f| f.meta.needs_blob()) {
            self.alloc.free(f.words[1]);
        }
    }

    /// Splits the segment `h` maps to into two new segments of one more
    /// local depth, and publishes a new directory (doubled when the
    /// segment's local depth equals the global depth) by one store of the
    /// root word. The old segment and directory are never changed, so a
    /// crash before that store leaves the old table whole, and after it the
    /// new one; the unpublished blocks are unreachable and the allocator's
    /// rebuild frees them. Each entry keeps its bucket and slot, so it fits
    /// (its new segment holds a subset of the old one's entries); older
    /// copies of a key are dropped.
    fn split(&self, st: &mut State, h: u64) -> Result<()> {
        let e = st.entry(h);
        let (seg, local) = (l::entry_seg(e), l::entry_depth(e));
        let depth = if local == st.depth { st.depth + 1 } else { st.depth };
        if depth > l::MAX_DEPTH {
            return Err(Error::Unsupported(format!(
                "hash table: segment {seg} cannot split beyond depth {}",
                l::MAX_DEPTH
            )));
        }
        // Each entry's hash, from its slot (no blob read for a key that
        // keeps it there); copies of one key are told apart by reading the
        // keys only where two entries share a hash.
        let mut entries: Vec<(u64, Found)> = self
            .segment_slots(seg)
            .into_iter()
            .map(|f| (slot_hash(&*self.space, self.key_hash, &f.words, f.meta), f))
            .collect();
        entries.sort_unstable_by_key(|(h, _)| *h);
        let mut newest: Vec<(u64, Found)> = Vec::with_capacity(entries.len());
        let mut dropped = Vec::new();
        let mut run_start = 0;
        for (h, f) in entries {
            if newest.last().is_none_or(|(last, _)| *last != h) {
                run_start = newest.len();
            }
            let key = |f: &Found| slot_key(&*self.space, &f.words, f.meta);
            let same = newest[run_start..].iter().position(|(_, g)| key(g) == key(&f));
            match same {
                Some(j) if newest[run_start + j].1.meta.version > f.meta.version => dropped.push(f),
                Some(j) => dropped.push(std::mem::replace(&mut newest[run_start + j].1, f)),
                None => newest.push((h, f)),
            }
        }
        let mut halves = [
            vec![0u8; l::SEGMENT_BYTES as usize],
            vec![0u8; l::SEGMENT_BYTES as usize],
        ];
        let mut headers = [[BucketHeader::default(); l::SEGMENT_BUCKETS as usize]; 2];
        for &(kh, f) in &newest {
            let half = l::split_bit(kh, local) as usize;
            let rel = (f.bucket - seg) as usize;
            let so = rel + l::slot_rel(f.slot) as usize;
            halves[half][so..so + l::SLOT_BYTES as usize].copy_from_slice(&l::slot_to_bytes(&f.words));
            let b = rel / l::BUCKET_BYTES as usize;
            headers[half][b] = headers[half][b].with(f.slot, l::fingerprint(kh));
        }
        for (half, hdrs) in halves.iter_mut().zip(&headers) {
            for (b, hdr) in hdrs.iter().enumerate() {
                let o = b * l::BUCKET_BYTES as usize;
                half[o..o + 8].copy_from_slice(&hdr.0.to_le_bytes());
            }
        }
        let mut fresh = Vec::new();
        let mut alloc = |size: u64| -> Result<u64> {
            let off = self.alloc.alloc(&*self.space, size)?;
            fresh.push(off);
            Ok(off)
        };
        // A split that doubles the directory writes a new one and swaps it
        // in with the root; any other rewrites its segment's entries in place.
        let doubles = depth > st.depth;
        let blocks = (|| {
            Ok::<_, Error>((
                alloc(l::SEGMENT_BYTES)?,
                alloc(l::SEGMENT_BYTES)?,
                if doubles {
                    Some(alloc(l::dir_bytes(depth))?)
                } else {
                    None
                },
            ))
        })();
        let (s0, s1, new_dir) = match blocks {
            Ok(b) => b,
            Err(err) => {
                for off in fresh {
                    self.alloc.free(off);
                }
                return Err(err);
            }
        };
        for (off, bytes) in [(s0, &halves[0]), (s1, &halves[1])] {
            self.space.write(off, bytes);
            self.space.flush(off, l::SEGMENT_BYTES, p::SEGMENT_FLUSH);
        }
        // The entry at index `j` of the directory after the split.
        let entry = |j: usize| {
            let old = st.entry_at(j >> (depth - st.depth));
            if old != e {
                old
            } else if (j >> (depth - 1 - local)) & 1 == 0 {
                l::dir_entry(s0, local + 1)
            } else {
                l::dir_entry(s1, local + 1)
            }
        };
        match new_dir {
            Some(dir) => {
                let entries: Vec<u64> = (0..1usize << depth).map(entry).collect();
                let mut bytes = Vec::with_capacity(l::dir_bytes(depth) as usize);
                bytes.extend_from_slice(&l::dir_word0(depth, self.key_hash).to_le_bytes());
                for w in &entries {
                    bytes.extend_from_slice(&w.to_le_bytes());
                }
                self.space.write(dir, &bytes);
                self.space.flush(dir, bytes.len() as u64, p::DIR_FLUSH);
                self.space.fence(p::SPLIT_FENCE);
                self.space.publish(self.root_off, dir, p::ROOT_FLUSH, p::ROOT_FENCE);
                self.alloc.free(st.dir);
                st.dir = dir;
                st.depth = depth;
                st.entries = entries_of(&entries);
                self.hint.store(st.entries.clone());
            }
            None => {
                // Writing a whole new directory per split cost every split
                // the directory's size (at a million keys about 50 flushed
                // lines per insert). Only the old segment's run changes: its
                // entries are stored in place, after the halves' fence, and
                // nothing else of the directory is read or copied. A crash
                // may persist some of them and not others; recovery then
                // rolls the run back to the old segment, which still holds
                // every entry of both halves (`torn_split`).
                self.space.fence(p::SPLIT_FENCE);
                let span = 1usize << (depth - local);
                let first = l::dir_index(h, depth) as usize & !(span - 1);
                let run: Vec<u64> = (first..first + span).map(entry).collect();
                store_entries(&*self.space, st.dir, first, &run);
                for (w, &e) in st.entries[first..first + span].iter().zip(&run) {
                    w.store(e, Ordering::Relaxed);
                }
            }
        }
        self.alloc.free(seg);
        self.free_blobs(&dropped);
        if let Some(hook) = self.split_hook.lock().clone() {
            hook();
        }
        self.splits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Stores `run` as the entries of directory `dir` from index `first` on,
/// in place, and makes them durable (`hash.direntry.flush`, `.fence`): a
/// split that keeps the depth, and recovery's rollback of one cut short.
fn store_entries<S: Space + ?Sized>(space: &S, dir: u64, first: usize, run: &[u64]) {
    let at = dir + 8 + 8 * first as u64;
    for (i, &w) in run.iter().enumerate() {
        space.store(at + 8 * i as u64, w);
    }
    space.flush(at, 8 * run.len() as u64, p::DIRENTRY_FLUSH);
    space.fence(p::DIRENTRY_FENCE);
}

/// The run of directory entries a split that kept the directory's depth
/// left half-stored (see `HashTable::split`): the aligned run of a segment's
/// entry `e` (local depth `d`) in which some entries already name one of
/// its halves (local depth `d + 1`; the run's lower half one segment, its
/// upper half another) and the others still `e`. Returns the run's first
/// index, its length and `e`. Only one split runs at a time, so there is at
/// most one such run; anything else out of line is left for the caller's
/// validation to refuse.
pub(super) fn torn_split(entries: &[u64], depth: u32) -> Option<(usize, usize, u64)> {
    let mut j = 0;
    while j < entries.len() {
        let e = entries[j];
        let local = l::entry_depth(e);
        if local >= depth {
            j += 1;
            continue;
        }
        let span = 1usize << (depth - local);
        let first = j & !(span - 1);
        let run = &entries[first..first + span];
        if run.iter().all(|&x| x == e) {
            j = first + span;
            continue;
        }
        // Each half's other entries: one segment of depth d + 1, if any.
        let half_of = |part: &[u64]| -> Option<Option<u64>> {
            let mut seen = None;
            for &x in part.iter().filter(|&&x| x != e) {
                if l::entry_depth(x) != local + 1 || seen.is_some_and(|s| s != x) {
                    return None;
                }
                seen = Some(x);
            }
            Some(seen)
        };
        let (lo, hi) = run.split_at(span / 2);
        if let (Some(a), Some(b)) = (half_of(lo), half_of(hi)) {
            if a.is_none() || b.is_none() || a != b {
                return Some((first, span, e));
            }
        }
        j += 1;
    }
    None
}

/// Most puts published together: a longer run of pairs is published in
/// groups of this many. A group's keys and bucket headers are short lists
/// searched in full for each put, and 64 puts already share each fence
/// among 64.
pub const GROUP_MAX: usize = 64;

/// A group of puts staged but not yet published ([`HashTable::put_group`]).
#[derive(Default)]
struct Group<'k> {
    /// Each bucket the group changes: the header to publish, and every
    /// slot in use or cleared by the group (not to be reused before the
    /// publish).
    headers: Vec<(u64, BucketHeader, BucketHeader)>,
    /// Entries the group replaces; their blobs are freed after the publish.
    replaced: Vec<Found>,
    /// Keys the group writes, with their hashes: a short list (at most
    /// [`GROUP_MAX`]), searched by hash first, where a hash set would hash
    /// every key a second time.
    keys: Vec<(u64, &'k [u8])>,
    /// Puts of new keys.
    new: u64,
}

fn check_lens(key: &[u8], value: &[u8]) -> Result<()> {
    if key.len() > MAX_LEN {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            limit: MAX_LEN,
        });
    }
    if value.len() > MAX_LEN {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            limit: MAX_LEN,
        });
    }
    Ok(())
}

/// Every line of the two buckets (the probe window) of table hash `h` in
/// segment `seg`.
fn bucket_lines(seg: u64, h: u64) -> impl Iterator<Item = u64> {
    (0..l::PROBE).flat_map(move |d| {
        let b = l::bucket_off(seg, l::home_bucket(h) + d);
        (0..l::BUCKET_BYTES).step_by(LINE as usize).map(move |line| b + line)
    })
}

fn read_slot<S: Space>(s: &S, off: u64) -> Slot {
    let mut b = [0u8; l::SLOT_BYTES as usize];
    s.read(off, &mut b);
    l::slot_from_bytes(&b)
}

fn slot_key<S: Space>(s: &S, w: &Slot, meta: Meta) -> Vec<u8> {
    match meta.key_inline {
        Some(n) => w[0].to_le_bytes()[..n as usize].to_vec(),
        None => {
            let (kl, _) = blob::lens(s.read_u64(w[1]));
            let mut k = vec![0u8; kl as usize];
            s.read(blob::key_at(w[1]), &mut k);
            k
        }
    }
}

/// The table hash (`key_hash`) of a slot's key: kept in the slot for a
/// key out of line (see [`l::Slot`]), else computed.
fn slot_hash<S: Space>(s: &S, key_hash: KeyHash, w: &Slot, meta: Meta) -> u64 {
    match meta.key_inline {
        None if w[0] != 0 => w[0],
        _ => key_hash.of(&slot_key(s, w, meta)),
    }
}

fn slot_key_eq<S: Space>(s: &S, w: &Slot, meta: Meta, key: &[u8]) -> bool {
    match meta.key_inline {
        Some(n) => n as usize == key.len() && w[0].to_le_bytes()[..key.len()] == *key,
        None => {
            key.len() > l::INLINE_MAX
                && blob::lens(s.read_u64(w[1])).0 == key.len() as u64
                && blob::cmp_key_at(s, blob::key_at(w[1]), key.len() as u64, key).is_eq()
        }
    }
}

/// Lends a slot's value to `f`: from the slot when inline, else in place
/// in its blob (the caller keeps the blob from being freed meanwhile).
fn with_slot_value<S: Space, R>(s: &S, w: &Slot, meta: Meta, f: impl FnOnce(&[u8]) -> R) -> R {
    match meta.value_inline {
        Some(n) => f(&w[2].to_le_bytes()[..n as usize]),
        None => {
            let (kl, vl) = blob::lens(s.read_u64(w[1]));
            s.with_bytes(blob::value_at(w[1], kl), vl, f)
        }
    }
}

/// A blob reference is inside the pool and its lengths match the slot.
fn validate_blob<S: Space>(s: &S, b: u64, meta: Meta, size: u64) -> std::result::Result<(), String> {
    if b == 0 || !b.is_multiple_of(LINE) || b.saturating_add(blob::size(0, 0)) > size {
        return Err(format!("invalid blob reference {b}"));
    }
    let (kl, vl) = blob::lens(s.read_u64(b));
    let key_ok = if meta.key_inline.is_none() {
        kl > l::INLINE_MAX as u64
    } else {
        kl == 0
    };
    let value_ok = if meta.value_inline.is_none() {
        vl > l::INLINE_MAX as u64
    } else {
        vl == 0
    };
    if !key_ok || !value_ok {
        return Err(format!("blob {b} lengths ({kl}, {vl}) do not match the slot"));
    }
    if blob::value_at(b, kl) + vl > size {
        return Err(format!("blob {b} overruns the pool"));
    }
    Ok(())
}
