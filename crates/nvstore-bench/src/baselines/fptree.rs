//! FPTree: I. Oukid, J. Lasperas, A. Nica, T. Willhalm, W. Lehner, "FPTree: A
//! Hybrid SCM-DRAM Persistent and Concurrent B-Tree for Storage Class
//! Memory", SIGMOD 2016.
//!
//! Leaves live in the pool, inner nodes in DRAM (rebuilt from the leaf list
//! after a crash, as the paper's selective persistence prescribes). Leaves are
//! unsorted; a validity bitmap says which slots hold a pair, and a 1-byte
//! fingerprint (hash) of each slot's key lets a search compare fingerprints
//! first and touch only the keys whose fingerprint matches.
//!
//! Leaf layout (`node_size` bytes, `m` slots, `W = ceil(m / 64)` bitmap words):
//!
//! ```text
//! [0, 8W)             bitmap: bit s%64 of word s/64 set = slot s holds a pair
//! [8W, 8W+8)          next: offset of the next leaf in key order (0 = last)
//! [8W+8, 8W+8+m)      fingerprints: u8 hash of the key in slot s
//! pad to 64           (the header is `H` bytes: whole lines)
//! [H, H + 16m)        slots: { u64 key, u64 value } (little-endian)
//! ```
//!
//! `m` is the largest count with `H + 16m <= node_size` (at most 256). The
//! paper sizes leaves so the bitmap is one word and the fingerprints share
//! the first line; larger `--node-size` values just make the header longer.
//!
//! Write path (paper Alg. 2-4):
//! - insert: write the pair and its fingerprint into a free slot, flush both
//!   lines, fence; set the slot's bit with one atomic 8-byte store, flush,
//!   fence. Common case: 3 lines flushed (pair, fingerprint, bitmap), 2 fences.
//! - update: out of place, as the paper: the new pair in a free slot
//!   (preferring the old slot's bitmap word), flushed and fenced, then one
//!   atomic store flips both bits. When the two bits lie in different words
//!   (only possible with more than 64 slots) a micro-log record covers the
//!   two stores.
//! - delete: clear the bit (one atomic store), flush, fence. A leaf left
//!   empty is unlinked under the delete micro-log and freed.
//! - split (paper Alg. 5, micro-log): log the leaf, allocate the new leaf and
//!   log it, copy the whole leaf and flush it, find the median key, write and
//!   flush the new leaf's bitmap (upper half), then the old leaf's (the rest),
//!   link the new leaf, reset the log. The separator goes into the DRAM inner
//!   nodes.
//!
//! Recovery ([`FpTree::recover`], paper §4.3 "Recovery"): the micro-logs
//! are replayed (a split whose leaf still has a full bitmap is discarded:
//! the copy never became visible; otherwise the leaf's bitmap is completed
//! and the new leaf linked; a logged unlink or two-word update is redone),
//! then the DRAM inner nodes are rebuilt from the leaf list, each leaf keyed
//! by its smallest key, and the allocator from the leaves reached.
//!
//! Simplifications: one writer at a time (the engine lock stands in for the
//! paper's HTM + leaf locks); inner nodes are the [`DramBTree`] of
//! `volatile.rs` keyed by each leaf's lower bound.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::pool::{align_line, check_node_size, Pool, LOG, ROOT};
use super::volatile::DramBTree;
use nvstore::pmem::{Point, Space};
use nvstore::Result;

const KV_FLUSH: Point = Point::new("fptree.kv.flush");
const KV_FENCE: Point = Point::new("fptree.kv.fence");
const BITMAP_FLUSH: Point = Point::new("fptree.bitmap.flush");
const BITMAP_FENCE: Point = Point::new("fptree.bitmap.fence");
const LOG_FLUSH: Point = Point::new("fptree.log.flush");
const LOG_FENCE: Point = Point::new("fptree.log.fence");
const NEWLEAF_FLUSH: Point = Point::new("fptree.newleaf.flush");
const NEWLEAF_FENCE: Point = Point::new("fptree.newleaf.fence");
const NEXT_FLUSH: Point = Point::new("fptree.next.flush");
const NEXT_FENCE: Point = Point::new("fptree.next.fence");

/// Split micro-log: { current leaf, new leaf }.
const SPLIT_LOG: u64 = LOG;
/// Delete micro-log: { leaf, previous leaf }.
const DELETE_LOG: u64 = LOG + 64;
/// Update micro-log (bits in different words): { leaf, old slot, new slot + 1 }.
const UPDATE_LOG: u64 = LOG + 128;

/// The 1-byte fingerprint of a key.
#[inline]
pub fn fingerprint(key: u64) -> u8 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Leaf geometry for a node size.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub slots: u64,
    pub words: u64,
    pub next: u64,
    pub fps: u64,
    pub kv: u64,
}

impl Geometry {
    pub fn new(node_size: u64) -> Geometry {
        let mut m = 256.min(node_size / 16);
        loop {
            let words = m.div_ceil(64);
            let h = align_line(8 * words + 8 + m);
            if h + 16 * m <= node_size || m <= 2 {
                return Geometry {
                    slots: m,
                    words,
                    next: 8 * words,
                    fps: 8 * words + 8,
                    kv: h,
                };
            }
            m -= 1;
        }
    }
}

struct State {
    /// Lower bound of each leaf -> leaf offset (the first leaf has bound 0).
    inner: DramBTree<u64>,
    splits: u64,
}

/// The FPTree engine.
pub struct FpTree<S: Space> {
    pool: Pool<S>,
    node_size: u64,
    g: Geometry,
    st: Mutex<State>,
}

type Bitmap = [u64; 4];

impl<S: Space> FpTree<S> {
    /// A new, empty tree in a zeroed space.
    pub fn new(space: Arc<S>, node_size: u64) -> Result<FpTree<S>> {
        check_node_size("fptree", node_size, 128)?;
        let pool = Pool::new(space)?;
        let g = Geometry::new(node_size);
        let leaf = pool.alloc(node_size);
        pool.space.zero(leaf, g.kv);
        pool.persist(leaf, g.kv, NEWLEAF_FLUSH, NEWLEAF_FENCE);
        pool.store(ROOT, leaf);
        pool.persist(ROOT, 8, NEXT_FLUSH, NEXT_FENCE);
        let mut inner = DramBTree::new(node_size);
        inner.insert(0, leaf);
        Ok(FpTree {
            pool,
            node_size,
            g,
            st: Mutex::new(State { inner, splits: 0 }),
        })
    }

    /// Reopens a tree from a crashed image: replays the micro-logs, then
    /// rebuilds the DRAM inner nodes from the leaves (paper §4.3).
    pub fn recover(space: Arc<S>, node_size: u64) -> Result<FpTree<S>> {
        let g = Geometry::new(node_size);
        let words = g.words;
        let full: Bitmap = {
            let mut b = [0u64; 4];
            for s in 0..g.slots {
                b[(s / 64) as usize] |= 1 << (s % 64);
            }
            b
        };
        let sp = &*space;
        let load_bm = |leaf: u64| {
            let mut b = [0u64; 4];
            for w in 0..words {
                b[w as usize] = sp.load(leaf + 8 * w);
            }
            b
        };
        // Split micro-log.
        let (leaf, new) = (sp.load(SPLIT_LOG), sp.load(SPLIT_LOG + 8));
        if leaf != 0 && new != 0 && sp.load(leaf + g.next) != new {
            let bm = load_bm(leaf);
            if bm != full {
                // The new leaf's bitmap was persisted before the leaf's: finish.
                let upper = load_bm(new);
                for w in 0..words {
                    sp.store(leaf + 8 * w, full[w as usize] & !upper[w as usize]);
                }
                sp.persist(leaf, 8 * words, BITMAP_FLUSH, BITMAP_FENCE);
                sp.store(leaf + g.next, new);
                sp.persist(leaf + g.next, 8, NEXT_FLUSH, NEXT_FENCE);
            }
        }
        sp.store(SPLIT_LOG, 0);
        sp.store(SPLIT_LOG + 8, 0);
        sp.persist(SPLIT_LOG, 16, LOG_FLUSH, LOG_FENCE);
        // Delete micro-log: redo the unlink.
        let (leaf, prev) = (sp.load(DELETE_LOG), sp.load(DELETE_LOG + 8));
        if leaf != 0 && prev != 0 {
            sp.store(prev + g.next, sp.load(leaf + g.next));
            sp.persist(prev + g.next, 8, NEXT_FLUSH, NEXT_FENCE);
        }
        sp.store(DELETE_LOG, 0);
        sp.store(DELETE_LOG + 8, 0);
        sp.persist(DELETE_LOG, 16, LOG_FLUSH, LOG_FENCE);
        // Update micro-log: redo both bits.
        let leaf = sp.load(UPDATE_LOG);
        if leaf != 0 {
            let (o, s) = (sp.load(UPDATE_LOG + 8), sp.load(UPDATE_LOG + 16) - 1);
            let (ow, sw) = (o / 64, s / 64);
            sp.store(leaf + 8 * sw, sp.load(leaf + 8 * sw) | 1 << (s % 64));
            sp.store(leaf + 8 * ow, sp.load(leaf + 8 * ow) & !(1 << (o % 64)));
            sp.persist(leaf, 8 * words, BITMAP_FLUSH, BITMAP_FENCE);
            sp.store(UPDATE_LOG, 0);
            sp.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
        }
        // Rebuild the inner nodes from the leaf list.
        let mut inner = DramBTree::new(node_size);
        let mut reachable = BTreeSet::new();
        let mut leaf = sp.load(ROOT);
        let mut first = true;
        while leaf != 0 {
            reachable.insert(leaf);
            let bm = load_bm(leaf);
            let min = (0..g.slots)
                .filter(|&s| bm[(s / 64) as usize] & (1 << (s % 64)) != 0)
                .map(|s| sp.load(leaf + g.kv + 16 * s))
                .min();
            if first {
                inner.insert(0, leaf);
            } else if let Some(k) = min {
                inner.insert(k, leaf);
            }
            first = false;
            leaf = sp.load(leaf + g.next);
        }
        let pool = Pool::recover(space, &reachable)?;
        Ok(FpTree {
            pool,
            node_size,
            g,
            st: Mutex::new(State { inner, splits: 0 }),
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.g
    }

    #[inline]
    fn kv(&self, leaf: u64, s: u64) -> u64 {
        leaf + self.g.kv + 16 * s
    }

    #[inline]
    fn bitmap(&self, leaf: u64) -> Bitmap {
        let mut b = [0u64; 4];
        for (w, word) in b.iter_mut().enumerate().take(self.g.words as usize) {
            *word = self.pool.load(leaf + 8 * w as u64);
        }
        b
    }

    /// The slot holding `key`: fingerprints first, keys only on a match.
    fn find(&self, leaf: u64, key: u64, bm: &Bitmap) -> Option<u64> {
        let m = self.g.slots as usize;
        let mut fps = [0u8; 256];
        self.pool.space.read(leaf + self.g.fps, &mut fps[..m]);
        let f = fingerprint(key);
        for (s, &fp) in fps[..m].iter().enumerate() {
            if fp == f && bm[s / 64] & (1 << (s % 64)) != 0 && self.pool.load(self.kv(leaf, s as u64)) == key {
                return Some(s as u64);
            }
        }
        None
    }

    /// A free slot, preferring bitmap word `prefer`.
    fn free_slot(&self, bm: &Bitmap, prefer: Option<u64>) -> Option<u64> {
        let m = self.g.slots;
        let in_word = |w: u64| {
            let used = bm[w as usize];
            let free = !used;
            let s = w * 64 + free.trailing_zeros() as u64;
            (free != 0 && s < m).then_some(s)
        };
        if let Some(w) = prefer {
            if let Some(s) = in_word(w) {
                return Some(s);
            }
        }
        (0..self.g.words).find_map(in_word)
    }

    /// Writes a pair and its fingerprint into slot `s`, flushed and fenced.
    fn write_slot(&self, leaf: u64, s: u64, key: u64, value: u64) {
        let at = self.kv(leaf, s);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&key.to_le_bytes());
        b[8..].copy_from_slice(&value.to_le_bytes());
        self.pool.space.write(at, &b);
        self.pool.space.write(leaf + self.g.fps + s, &[fingerprint(key)]);
        self.pool.space.flush(at, 16, KV_FLUSH);
        self.pool.space.flush(leaf + self.g.fps + s, 1, KV_FLUSH);
        self.pool.space.fence(KV_FENCE);
    }

    fn put(&self, st: &mut State, key: u64, value: u64, update_only: bool) -> bool {
        loop {
            let (_, leaf) = st.inner.floor(key).expect("the first leaf covers every key");
            let bm = self.bitmap(leaf);
            let old = self.find(leaf, key, &bm);
            if update_only && old.is_none() {
                return false;
            }
            let Some(s) = self.free_slot(&bm, old.map(|o| o / 64)) else {
                self.split(st, leaf, &bm);
                continue;
            };
            self.write_slot(leaf, s, key, value);
            let (w, bit) = (s / 64, 1u64 << (s % 64));
            match old {
                None => {
                    self.pool.store(leaf + 8 * w, bm[w as usize] | bit);
                    self.pool.persist(leaf + 8 * w, 8, BITMAP_FLUSH, BITMAP_FENCE);
                }
                Some(o) if o / 64 == w => {
                    // One atomic store invalidates the old slot and validates the new one.
                    let obit = 1u64 << (o % 64);
                    self.pool.store(leaf + 8 * w, (bm[w as usize] | bit) & !obit);
                    self.pool.persist(leaf + 8 * w, 8, BITMAP_FLUSH, BITMAP_FENCE);
                }
                Some(o) => {
                    let ow = o / 64;
                    self.pool.store(UPDATE_LOG + 8, o);
                    self.pool.store(UPDATE_LOG + 16, s + 1);
                    self.pool.persist(UPDATE_LOG + 8, 16, LOG_FLUSH, LOG_FENCE);
                    self.pool.store(UPDATE_LOG, leaf);
                    self.pool.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
                    self.pool.store(leaf + 8 * w, bm[w as usize] | bit);
                    self.pool.store(leaf + 8 * ow, bm[ow as usize] & !(1u64 << (o % 64)));
                    self.pool.persist(leaf, 8 * self.g.words, BITMAP_FLUSH, BITMAP_FENCE);
                    self.pool.store(UPDATE_LOG, 0);
                    self.pool.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
                }
            }
            return old.is_some();
        }
    }

    /// Splits a full leaf (paper Alg. 5, with the split micro-log).
    fn split(&self, st: &mut State, leaf: u64, bm: &Bitmap) {
        let p = &self.pool;
        p.store(SPLIT_LOG, leaf);
        p.persist(SPLIT_LOG, 8, LOG_FLUSH, LOG_FENCE);
        let new = p.alloc(self.node_size);
        p.store(SPLIT_LOG + 8, new);
        p.persist(SPLIT_LOG + 8, 8, LOG_FLUSH, LOG_FENCE);
        // Copy the whole leaf and persist the copy.
        let mut buf = vec![0u8; self.node_size as usize];
        p.space.read(leaf, &mut buf);
        p.space.write(new, &buf);
        p.persist(new, self.node_size, NEWLEAF_FLUSH, NEWLEAF_FENCE);
        // The split key: the median of the valid keys.
        let mut valid: Vec<(u64, u64)> = (0..self.g.slots)
            .filter(|&s| bm[(s / 64) as usize] & (1 << (s % 64)) != 0)
            .map(|s| (p.load(self.kv(leaf, s)), s))
            .collect();
        valid.sort_unstable();
        let half = valid.len() / 2;
        let split_key = valid[half].0;
        let mut upper = [0u64; 4];
        for &(_, s) in &valid[half..] {
            upper[(s / 64) as usize] |= 1 << (s % 64);
        }
        for w in 0..self.g.words {
            p.store(new + 8 * w, upper[w as usize]);
        }
        p.persist(new, 8 * self.g.words, BITMAP_FLUSH, BITMAP_FENCE);
        for w in 0..self.g.words {
            p.store(leaf + 8 * w, bm[w as usize] & !upper[w as usize]);
        }
        p.persist(leaf, 8 * self.g.words, BITMAP_FLUSH, BITMAP_FENCE);
        p.store(leaf + self.g.next, new);
        p.persist(leaf + self.g.next, 8, NEXT_FLUSH, NEXT_FENCE);
        p.store(SPLIT_LOG, 0);
        p.store(SPLIT_LOG + 8, 0);
        p.persist(SPLIT_LOG, 16, LOG_FLUSH, LOG_FENCE);
        st.inner.insert(split_key, new);
        st.splits += 1;
    }

    fn remove(&self, st: &mut State, key: u64) -> bool {
        let (low, leaf) = st.inner.floor(key).expect("the first leaf covers every key");
        let mut bm = self.bitmap(leaf);
        let Some(s) = self.find(leaf, key, &bm) else {
            return false;
        };
        let w = (s / 64) as usize;
        bm[w] &= !(1 << (s % 64));
        self.pool.store(leaf + 8 * w as u64, bm[w]);
        self.pool.persist(leaf + 8 * w as u64, 8, BITMAP_FLUSH, BITMAP_FENCE);
        if low != 0 && bm.iter().all(|&x| x == 0) {
            // Unlink and free the empty leaf under the delete micro-log.
            let p = &self.pool;
            let (_, prev) = st.inner.floor(low - 1).expect("a leaf precedes every non-first leaf");
            p.store(DELETE_LOG, leaf);
            p.store(DELETE_LOG + 8, prev);
            p.persist(DELETE_LOG, 16, LOG_FLUSH, LOG_FENCE);
            p.store(prev + self.g.next, p.load(leaf + self.g.next));
            p.persist(prev + self.g.next, 8, NEXT_FLUSH, NEXT_FENCE);
            p.store(DELETE_LOG, 0);
            p.store(DELETE_LOG + 8, 0);
            p.persist(DELETE_LOG, 16, LOG_FLUSH, LOG_FENCE);
            st.inner.remove(low);
            p.free(leaf);
        }
        true
    }

    fn get(&self, st: &State, key: u64) -> Option<u64> {
        let (_, leaf) = st.inner.floor(key).expect("the first leaf covers every key");
        let bm = self.bitmap(leaf);
        self.find(leaf, key, &bm).map(|s| self.pool.load(self.kv(leaf, s) + 8))
    }

    fn scan_from(&self, st: &State, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let (_, mut leaf) = st.inner.floor(start).expect("the first leaf covers every key");
        let mut got = 0;
        let mut tmp = Vec::with_capacity(self.g.slots as usize);
        while got < n && leaf != 0 {
            let bm = self.bitmap(leaf);
            tmp.clear();
            for s in 0..self.g.slots {
                if bm[(s / 64) as usize] & (1 << (s % 64)) != 0 {
                    let k = self.pool.load(self.kv(leaf, s));
                    if k >= start {
                        tmp.push((k, self.pool.load(self.kv(leaf, s) + 8)));
                    }
                }
            }
            tmp.sort_unstable();
            for &kv in tmp.iter().take(n - got) {
                out.push(kv);
                got += 1;
            }
            leaf = self.pool.load(leaf + self.g.next);
        }
    }
}

single_lock_bench_index!(FpTree, "fptree", "fingerprint");
