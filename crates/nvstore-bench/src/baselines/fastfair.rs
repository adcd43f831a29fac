//! FAST-FAIR: D. Hwang, W.-H. Kim, Y. Won, B. Nam, "Endurable Transient
//! Inconsistency in Byte-Addressable Persistent B+-Tree", FAST 2018.
//!
//! Every node, leaf and inner, lives in the pool, as in the paper. Nodes are
//! sorted; FAST (Failure-Atomic ShifT) inserts and deletes by shifting
//! records one 8-byte store at a time in an order that leaves at most a
//! transient duplicate, which readers skip, and flushes each cache line once
//! the shift has finished with it. FAIR (Failure-Atomic In-place Rebalance)
//! splits by writing and flushing the new sibling, linking it, then
//! truncating the old node with one null pointer.
//!
//! Node layout (`node_size` bytes, `c = (node_size - 32) / 16` records; a
//! node holds at most `c - 1` pairs so a null pointer always ends the array):
//!
//! ```text
//!  0  u64 leftmost_ptr     0 in leaves; child for keys < records[0].key in inner nodes
//!  8  u64 sibling_ptr      right sibling at the same level (0 = none)
//! 16  u64 meta             level u32 | switch_counter u8 << 32 | is_deleted u8 << 40
//!                          | last_index i16 << 48 (a hint for count())
//! 24  u64 unused           (FAST-FAIR's volatile lock pointer)
//! 32  records[c]           { u64 key, u64 ptr }, sorted by key; ptr == 0 ends the array.
//!                          Leaves: ptr is the 8-byte value. Inner: ptr is the child
//!                          for keys in [key, next key).
//! ```
//!
//! Write path (paper §4, and `insert_key`/`store`/`remove_key` of the
//! authors' code): insert moves the terminating null one slot right, then
//! shifts larger records right from the end, each record's pointer before its
//! key, flushing (and fencing) a cache line when the shift leaves it, and
//! finally writes the new record (pointer duplicate, key, pointer) and
//! flushes its line. So an insert flushes one line per cache line the shift
//! crosses: 1 when appending, up to every line of the node. Delete shifts
//! left symmetrically. A split writes the sibling, flushes the whole node,
//! links it (flushing the header), truncates the old node by nulling one
//! pointer, and inserts the separator into the parent (a new root is written
//! and flushed, then the root word is stored and flushed).
//!
//! Simplifications (say so in results):
//! - one writer at a time and readers under the same lock, so the switch
//!   counter is kept but readers only scan left to right, and the lock-free
//!   readers' retry never fires;
//! - the 8-byte value is stored in the record's pointer word, as the
//!   authors' benchmarks do (they insert the key as the pointer), so value 0
//!   (the null that ends the array) cannot be stored and the insert panics on
//!   it; since values need not be unique, a reader treats a record as a
//!   transient duplicate only when both its key and pointer equal its left
//!   neighbour's (the paper compares pointers, which are unique there);
//! - a left shift flushes each line after its last store (the authors' code
//!   flushes a line at its first store); deletes never merge or rebalance
//!   underfull nodes (the paper's code does); no recovery procedure;
//! - recovery ([`FastFair::recover`]) is eager where the paper's is lazy:
//!   each level is walked along the sibling pointers and a node still
//!   holding records that belong to its sibling (a FAIR split interrupted
//!   before the truncation) is truncated; transient duplicates left by an
//!   interrupted shift stay, and readers skip them as they do at run time.
//!   The paper assumes stores to one cache line reach memory in program
//!   order (FAST); word-torn crash images break that assumption, so the
//!   crash campaign uses line-granular images for this engine;
//! - `update` and an insert of a present key store the new value in place
//!   with one atomic 8-byte store (FAST-FAIR has no update of its own).

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::pool::{check_node_size, line_of, Pool, ROOT};
use nvstore::pmem::{Point, Space, LINE};
use nvstore::Result;

const SHIFT_FLUSH: Point = Point::new("fastfair.shift.flush");
const SHIFT_FENCE: Point = Point::new("fastfair.shift.fence");
const NODE_FLUSH: Point = Point::new("fastfair.node.flush");
const NODE_FENCE: Point = Point::new("fastfair.node.fence");
const HEADER_FLUSH: Point = Point::new("fastfair.header.flush");
const HEADER_FENCE: Point = Point::new("fastfair.header.fence");
const ROOT_FLUSH: Point = Point::new("fastfair.root.flush");
const ROOT_FENCE: Point = Point::new("fastfair.root.fence");
const VALUE_FLUSH: Point = Point::new("fastfair.value.flush");
const VALUE_FENCE: Point = Point::new("fastfair.value.fence");

const LEFTMOST: u64 = 0;
const SIBLING: u64 = 8;
const META: u64 = 16;
const RECORDS: u64 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meta {
    level: u32,
    switch: u8,
    deleted: u8,
    last_index: i16,
}

impl Meta {
    fn decode(w: u64) -> Meta {
        Meta {
            level: w as u32,
            switch: (w >> 32) as u8,
            deleted: (w >> 40) as u8,
            last_index: (w >> 48) as u16 as i16,
        }
    }
    fn encode(self) -> u64 {
        self.level as u64
            | (self.switch as u64) << 32
            | (self.deleted as u64) << 40
            | (self.last_index as u16 as u64) << 48
    }
}

#[inline]
fn is_forward(switch: u8) -> bool {
    switch.is_multiple_of(2)
}

struct State {
    root: u64,
    splits: u64,
}

/// The FAST-FAIR engine.
pub struct FastFair<S: Space> {
    pool: Pool<S>,
    node_size: u64,
    /// Records per node (`c`); at most `c - 1` hold pairs.
    cardinality: u64,
    st: Mutex<State>,
}

/// Result of a leaf lookup.
enum Found {
    At(u64, u64),
    Absent,
}

impl<S: Space> FastFair<S> {
    /// A new, empty tree in a zeroed space.
    pub fn new(space: Arc<S>, node_size: u64) -> Result<FastFair<S>> {
        check_node_size("fastfair", node_size, 128)?;
        let pool = Pool::new(space)?;
        let t = FastFair {
            pool,
            node_size,
            cardinality: (node_size - RECORDS) / 16,
            st: Mutex::new(State { root: 0, splits: 0 }),
        };
        let root = t.new_node(0);
        t.pool.persist(root, LINE, NODE_FLUSH, NODE_FENCE);
        t.pool.store(ROOT, root);
        t.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
        t.st.lock().root = root;
        Ok(t)
    }

    /// Pairs a node holds at most.
    /// Reopens a tree from a crashed image: completes interrupted FAIR
    /// splits level by level and rebuilds the allocator.
    pub fn recover(space: Arc<S>, node_size: u64) -> Result<FastFair<S>> {
        let sp = &*space;
        let card = (node_size - RECORDS) / 16;
        let key = |n: u64, i: u64| sp.load(n + RECORDS + 16 * i);
        let ptr = |n: u64, i: u64| sp.load(n + RECORDS + 16 * i + 8);
        let root = sp.load(ROOT);
        let mut reachable = BTreeSet::new();
        let mut first = root;
        loop {
            let leaf_level = Meta::decode(sp.load(first + META)).level == 0;
            let mut n = first;
            while n != 0 {
                reachable.insert(n);
                let sib = sp.load(n + SIBLING);
                if sib != 0 && ptr(sib, 0) != 0 {
                    // Leaves: records from the sibling's first key on moved;
                    // inner nodes: from the record whose child became the
                    // sibling's leftmost (the separator went up).
                    let (sk, sl) = (key(sib, 0), sp.load(sib + LEFTMOST));
                    let cut = (0..card - 1).take_while(|&i| ptr(n, i) != 0).find(|&i| {
                        if leaf_level {
                            key(n, i) >= sk
                        } else {
                            ptr(n, i) == sl
                        }
                    });
                    if let Some(i) = cut {
                        sp.store(n + RECORDS + 16 * i + 8, 0);
                        sp.persist(n + RECORDS + 16 * i + 8, 8, SHIFT_FLUSH, SHIFT_FENCE);
                        let mut mt = Meta::decode(sp.load(n + META));
                        mt.last_index = i as i16 - 1;
                        sp.store(n + META, mt.encode());
                        sp.persist(n + META, 8, HEADER_FLUSH, HEADER_FENCE);
                    }
                }
                n = sib;
            }
            if leaf_level {
                break;
            }
            first = sp.load(first + LEFTMOST);
        }
        let pool = Pool::recover(space, &reachable)?;
        Ok(FastFair {
            pool,
            node_size,
            cardinality: card,
            st: Mutex::new(State { root, splits: 0 }),
        })
    }

    pub fn max_entries(&self) -> u64 {
        self.cardinality - 1
    }

    // ---- raw record access -------------------------------------------------

    #[inline]
    fn key(&self, n: u64, i: u64) -> u64 {
        self.pool.load(n + RECORDS + 16 * i)
    }
    #[inline]
    fn ptr(&self, n: u64, i: u64) -> u64 {
        self.pool.load(n + RECORDS + 16 * i + 8)
    }
    #[inline]
    fn set_key(&self, n: u64, i: u64, k: u64) {
        self.pool.store(n + RECORDS + 16 * i, k)
    }
    #[inline]
    fn set_ptr(&self, n: u64, i: u64, p: u64) {
        self.pool.store(n + RECORDS + 16 * i + 8, p)
    }
    #[inline]
    fn rec(&self, n: u64, i: u64) -> u64 {
        n + RECORDS + 16 * i
    }
    #[inline]
    fn meta(&self, n: u64) -> Meta {
        Meta::decode(self.pool.load(n + META))
    }
    #[inline]
    fn set_meta(&self, n: u64, m: Meta) {
        self.pool.store(n + META, m.encode())
    }
    #[inline]
    fn leftmost(&self, n: u64) -> u64 {
        self.pool.load(n + LEFTMOST)
    }
    #[inline]
    fn sibling(&self, n: u64) -> u64 {
        self.pool.load(n + SIBLING)
    }

    /// Allocates a node with an empty record array (not flushed).
    fn new_node(&self, level: u32) -> u64 {
        let n = self.pool.alloc(self.node_size);
        // Header and records 0 and 1: an empty array whose readers stop at once.
        self.pool.space.zero(n, RECORDS + 32);
        self.set_meta(
            n,
            Meta {
                level,
                switch: 0,
                deleted: 0,
                last_index: -1,
            },
        );
        n
    }

    /// Number of records (FAST-FAIR `count()`: from the last-index hint to the null).
    fn count(&self, n: u64) -> u64 {
        let m = self.meta(n);
        let mut c = (m.last_index as i64 + 1).clamp(0, self.cardinality as i64 - 1) as u64;
        if self.ptr(n, c) != 0 {
            while self.ptr(n, c) != 0 {
                c += 1;
            }
        } else {
            while c > 0 && self.ptr(n, c - 1) == 0 {
                c -= 1;
            }
        }
        c
    }

    /// Flush + fence of the line holding `off` (FAST-FAIR's `clflush`, which
    /// is fenced on both sides; one fence per flush here).
    #[inline]
    fn flush_line(&self, off: u64) {
        self.pool.persist(line_of(off), LINE, SHIFT_FLUSH, SHIFT_FENCE);
    }

    /// FAST insert of (key, ptr) into node `n` holding `cnt` records.
    fn insert_key(&self, n: u64, key: u64, ptr: u64, cnt: u64, flush: bool) {
        let mut m = self.meta(n);
        if !is_forward(m.switch) {
            m.switch = m.switch.wrapping_add(1);
            self.set_meta(n, m);
        }
        if cnt == 0 {
            self.set_key(n, 0, key);
            self.set_ptr(n, 0, ptr);
            self.set_ptr(n, 1, 0);
            if flush {
                self.flush_line(self.rec(n, 0));
            }
        } else {
            // Move the terminating null one slot right.
            self.set_ptr(n, cnt + 1, self.ptr(n, cnt));
            if flush && (self.rec(n, cnt + 1) + 8).is_multiple_of(LINE) {
                self.flush_line(self.rec(n, cnt + 1) + 8);
            }
            let mut inserted = false;
            let mut i = cnt as i64 - 1;
            while i >= 0 {
                let iu = i as u64;
                if key < self.key(n, iu) {
                    self.set_ptr(n, iu + 1, self.ptr(n, iu));
                    self.set_key(n, iu + 1, self.key(n, iu));
                    // The shift leaves a line when it has written that line's first record.
                    if flush && self.rec(n, iu + 1).is_multiple_of(LINE) {
                        self.flush_line(self.rec(n, iu + 1));
                    }
                } else {
                    self.set_ptr(n, iu + 1, self.ptr(n, iu));
                    self.set_key(n, iu + 1, key);
                    self.set_ptr(n, iu + 1, ptr);
                    if flush {
                        self.flush_line(self.rec(n, iu + 1));
                    }
                    inserted = true;
                    break;
                }
                i -= 1;
            }
            if !inserted {
                self.set_ptr(n, 0, self.leftmost(n));
                self.set_key(n, 0, key);
                self.set_ptr(n, 0, ptr);
                if flush {
                    self.flush_line(self.rec(n, 0));
                }
            }
        }
        let mut m = self.meta(n);
        m.last_index = cnt as i16;
        self.set_meta(n, m);
    }

    /// Whether record `i` (> 0) is a transient duplicate of its left neighbour.
    #[inline]
    fn duplicate(&self, n: u64, i: u64, leaf: bool) -> bool {
        self.ptr(n, i - 1) == self.ptr(n, i) && (!leaf || self.key(n, i - 1) == self.key(n, i))
    }

    /// The child of inner node `n` to follow for `key` (or its sibling, FAIR).
    fn inner_search(&self, n: u64, key: u64) -> u64 {
        let ret;
        loop {
            let sw = self.meta(n).switch;
            let r = if key < self.key(n, 0) && self.leftmost(n) != self.ptr(n, 0) {
                self.leftmost(n)
            } else {
                let mut i = 1;
                loop {
                    if self.ptr(n, i) == 0 {
                        break self.ptr(n, i - 1);
                    }
                    if key < self.key(n, i) && !self.duplicate(n, i, false) {
                        break self.ptr(n, i - 1);
                    }
                    i += 1;
                }
            };
            if self.meta(n).switch == sw {
                ret = r;
                break;
            }
        }
        let sib = self.sibling(n);
        if sib != 0 && self.ptr(sib, 0) != 0 && key >= self.key(sib, 0) {
            return sib;
        }
        if ret != 0 {
            ret
        } else {
            self.leftmost(n)
        }
    }

    /// The leaf for `key`, descending from the root.
    fn find_leaf(&self, root: u64, key: u64) -> u64 {
        let mut p = root;
        while self.meta(p).level > 0 {
            p = self.inner_search(p, key);
        }
        p
    }

    /// Leaf search, following siblings (FAIR).
    fn leaf_lookup(&self, mut n: u64, key: u64) -> Found {
        loop {
            let sw = self.meta(n).switch;
            let mut ret = None;
            if self.ptr(n, 0) != 0 && self.key(n, 0) == key {
                ret = Some(0);
            } else {
                let mut i = 1;
                while self.ptr(n, i) != 0 {
                    if self.key(n, i) == key && !self.duplicate(n, i, true) {
                        ret = Some(i);
                        break;
                    }
                    i += 1;
                }
            }
            if self.meta(n).switch != sw {
                continue;
            }
            if let Some(i) = ret {
                return Found::At(n, i);
            }
            let sib = self.sibling(n);
            if sib != 0 && self.ptr(sib, 0) != 0 && key >= self.key(sib, 0) {
                n = sib;
                continue;
            }
            return Found::Absent;
        }
    }

    /// FAST-FAIR `store`: inserts (key, right) into node `n` at `level`,
    /// splitting (FAIR) when full.
    fn store(&self, st: &mut State, mut n: u64, key: u64, right: u64) {
        loop {
            let sib = self.sibling(n);
            if sib != 0 && self.ptr(sib, 0) != 0 && key > self.key(sib, 0) {
                n = sib;
                continue;
            }
            break;
        }
        let cnt = self.count(n);
        if cnt < self.cardinality - 1 {
            self.insert_key(n, key, right, cnt, true);
            return;
        }
        // FAIR split.
        let level = self.meta(n).level;
        let sibling = self.pool.alloc(self.node_size);
        let m = cnt / 2;
        let split_key = self.key(n, m);
        let from = if level == 0 { m } else { m + 1 };
        let moved = cnt - from;
        let mut buf = vec![0u8; self.node_size as usize];
        let w =
            |buf: &mut Vec<u8>, off: u64, v: u64| buf[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
        w(&mut buf, LEFTMOST, if level == 0 { 0 } else { self.ptr(n, m) });
        w(&mut buf, SIBLING, self.sibling(n));
        w(
            &mut buf,
            META,
            Meta {
                level,
                switch: 0,
                deleted: 0,
                last_index: moved as i16 - 1,
            }
            .encode(),
        );
        for j in 0..moved {
            w(&mut buf, RECORDS + 16 * j, self.key(n, from + j));
            w(&mut buf, RECORDS + 16 * j + 8, self.ptr(n, from + j));
        }
        // records[moved].ptr is already 0: the array's end.
        self.pool.space.write(sibling, &buf);
        self.pool.persist(sibling, self.node_size, NODE_FLUSH, NODE_FENCE);
        // Link the sibling.
        self.pool.store(n + SIBLING, sibling);
        self.pool.persist(n, RECORDS, HEADER_FLUSH, HEADER_FENCE);
        // Truncate the old node with one null pointer.
        let mut mt = self.meta(n);
        mt.switch = if is_forward(mt.switch) {
            mt.switch.wrapping_add(2)
        } else {
            mt.switch.wrapping_add(1)
        };
        self.set_meta(n, mt);
        self.set_ptr(n, m, 0);
        self.flush_line(self.rec(n, m) + 8);
        mt.last_index = m as i16 - 1;
        self.set_meta(n, mt);
        self.pool.persist(n + META, 8, HEADER_FLUSH, HEADER_FENCE);
        if level == 0 {
            st.splits += 1;
        }
        // Insert the pending key into the half that covers it.
        if key < split_key {
            self.insert_key(n, key, right, m, true);
        } else {
            self.insert_key(sibling, key, right, moved, true);
        }
        // The separator goes up.
        if n == st.root {
            let r = self.new_node(level + 1);
            self.pool.store(r + LEFTMOST, n);
            self.set_key(r, 0, split_key);
            self.set_ptr(r, 0, sibling);
            self.set_ptr(r, 1, 0);
            let mut rm = self.meta(r);
            rm.last_index = 0;
            self.set_meta(r, rm);
            self.pool.persist(r, self.node_size, NODE_FLUSH, NODE_FENCE);
            self.pool.store(ROOT, r);
            self.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
            st.root = r;
        } else {
            self.insert_internal(st, split_key, sibling, level + 1);
        }
    }

    /// `btree_insert_internal`: the node at `level` covering `key` gets (key, right).
    fn insert_internal(&self, st: &mut State, key: u64, right: u64, level: u32) {
        let mut p = st.root;
        while self.meta(p).level > level {
            p = self.inner_search(p, key);
        }
        self.store(st, p, key, right);
    }

    /// FAST delete of record `i` of node `n` (shift left).
    fn remove_at(&self, n: u64, i: u64) {
        let mut m = self.meta(n);
        if is_forward(m.switch) {
            m.switch = m.switch.wrapping_add(1);
            self.set_meta(n, m);
        }
        // Hide the record: a duplicate of its left neighbour's pointer first.
        let left = if i == 0 { self.leftmost(n) } else { self.ptr(n, i - 1) };
        self.set_ptr(n, i, left);
        let mut j = i;
        loop {
            let next_ptr = self.ptr(n, j + 1);
            self.set_key(n, j, self.key(n, j + 1));
            self.set_ptr(n, j, next_ptr);
            // Flush a line once the shift is done with it (its last record, or the end).
            if next_ptr == 0 || self.rec(n, j + 1).is_multiple_of(LINE) {
                self.flush_line(self.rec(n, j));
            }
            if next_ptr == 0 {
                break;
            }
            j += 1;
        }
        let mut m = self.meta(n);
        m.last_index -= 1;
        self.set_meta(n, m);
    }

    fn put(&self, st: &mut State, key: u64, value: u64, update_only: bool) -> bool {
        assert!(
            value != 0,
            "fastfair: value 0 is the null pointer that ends a FAST-FAIR node"
        );
        let leaf = self.find_leaf(st.root, key);
        match self.leaf_lookup(leaf, key) {
            Found::At(n, i) => {
                self.set_ptr(n, i, value);
                self.pool.persist(self.rec(n, i) + 8, 8, VALUE_FLUSH, VALUE_FENCE);
                true
            }
            Found::Absent if update_only => false,
            Found::Absent => {
                self.store(st, leaf, key, value);
                false
            }
        }
    }

    fn remove(&self, st: &mut State, key: u64) -> bool {
        let leaf = self.find_leaf(st.root, key);
        match self.leaf_lookup(leaf, key) {
            Found::At(n, i) => {
                self.remove_at(n, i);
                true
            }
            Found::Absent => false,
        }
    }

    fn get(&self, st: &State, key: u64) -> Option<u64> {
        let leaf = self.find_leaf(st.root, key);
        match self.leaf_lookup(leaf, key) {
            Found::At(n, i) => Some(self.ptr(n, i)),
            Found::Absent => None,
        }
    }

    fn scan_from(&self, st: &State, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let mut leaf = self.find_leaf(st.root, start);
        let mut got = 0;
        while leaf != 0 && got < n {
            let mut i = 0;
            while got < n && self.ptr(leaf, i) != 0 {
                let k = self.key(leaf, i);
                if k >= start && !(i > 0 && self.duplicate(leaf, i, true)) {
                    out.push((k, self.ptr(leaf, i)));
                    got += 1;
                }
                i += 1;
            }
            leaf = self.sibling(leaf);
        }
    }
}

single_lock_bench_index!(FastFair, "fastfair", "sorted");
