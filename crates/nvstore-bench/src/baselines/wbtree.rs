//! wB+-tree: S. Chen, Q. Jin, "Persistent B+-Trees in Non-Volatile Main
//! Memory", PVLDB 8(7), 2015 (VLDB'15): the variant with a slot array and a
//! bitmap in every node.
//!
//! Every node, leaf and inner, lives in the pool, as in the paper. Entries
//! are unsorted; the bitmap says which entry slots are in use and the slot
//! array lists the used slots in key order, so searches are binary searches
//! through one indirection. Bit 0 of the bitmap says whether the slot array
//! is valid: it is cleared (and persisted) before the slot array changes and
//! set again by the atomic bitmap store that publishes the change, so after a
//! crash an invalid slot array is rebuilt from the bitmap.
//!
//! Node layout (`node_size` bytes, `m` entry slots, at most 255):
//!
//! ```text
//! line 0:  [0, 32)    bitmap, 4 words: word 0 bit 0 = slot array valid;
//!                     bit (s + 1) % 64 of word (s + 1) / 64 = entry slot s in use
//!          [32, 40)   next: right sibling (leaves) / leftmost child (inner nodes)
//!          [40, 48)   level (0 = leaf)
//! [64, 65 + m)        slot array: u8 count, then `count` u8 entry slots in key order
//! [K, K + 16m)        entries: { u64 key, u64 value } (inner: value = child for keys >= key)
//!                     K = 64 + (1 + m) rounded up to 64
//! ```
//!
//! Write path (paper §4, "slot+bitmap" nodes):
//! - insert: clear the slot-array-valid bit, flush, fence; write the entry
//!   into a free slot; insert its slot number into the slot array (shift);
//!   flush the entry and the changed slot-array lines; fence; set the entry's
//!   bit and the valid bit with one atomic store, flush, fence. Common case
//!   with nodes up to 1 KB: 4 lines flushed (bitmap, entry, slot array,
//!   bitmap), 3 fences; longer slot arrays flush more lines.
//! - delete: the same with the slot removed from the slot array and the bit
//!   cleared.
//! - update: out of place like an insert: the new entry in a free slot (in
//!   the old slot's bitmap word when possible), the slot array entry
//!   replaced, then one atomic store sets the new bit and clears the old one.
//! - split: redo logging. The new node (upper half, sorted, valid slot array)
//!   is written and flushed; a redo record (node, new node, separator, the
//!   node's new bitmap) is written and flushed, then committed by storing the
//!   log length; the old node's bitmap, slot count and sibling are updated and
//!   flushed; the separator is inserted into the parent with the normal
//!   insert (recursively splitting, each split appending a record); a new
//!   root is written and flushed before the root word is stored; finally the
//!   log is truncated.
//!
//! Bitmaps of more than one word (nodes over 1 KB) cannot be published by one
//! store: the entry's word is stored and persisted first, then word 0 with
//! the valid bit; an update whose two bits lie in different words is covered
//! by an update log record.
//!
//! Recovery ([`WbTree::recover`]): a logged two-word update is redone; the
//! committed split records are redone (the node's bitmap, sibling and slot
//! array), every node whose slot array is marked invalid has it rebuilt from
//! the bitmap, the allocator is rebuilt from the reachable nodes, and then,
//! from the highest record down, each split's separator is inserted into its
//! parent (a new root grown) unless the parent already holds it; finally the
//! log is truncated.
//!
//! Simplifications: one writer at a time, readers under the same lock; deletes
//! never merge nodes.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::pool::{align_line, check_node_size, line_of, Pool, LOG, LOG_SIZE, ROOT};
use nvstore::pmem::{Point, Space, LINE};
use nvstore::Result;

const INVALIDATE_FLUSH: Point = Point::new("wbtree.invalidate.flush");
const INVALIDATE_FENCE: Point = Point::new("wbtree.invalidate.fence");
const ENTRY_FLUSH: Point = Point::new("wbtree.entry.flush");
const ENTRY_FENCE: Point = Point::new("wbtree.entry.fence");
const BITMAP_FLUSH: Point = Point::new("wbtree.bitmap.flush");
const BITMAP_FENCE: Point = Point::new("wbtree.bitmap.fence");
const NODE_FLUSH: Point = Point::new("wbtree.node.flush");
const NODE_FENCE: Point = Point::new("wbtree.node.fence");
const LOG_FLUSH: Point = Point::new("wbtree.log.flush");
const LOG_FENCE: Point = Point::new("wbtree.log.fence");
const ROOT_FLUSH: Point = Point::new("wbtree.root.flush");
const ROOT_FENCE: Point = Point::new("wbtree.root.fence");

const NEXT: u64 = 32;
const LEVEL: u64 = 40;
const SLOTS: u64 = 64;

/// Redo log: word 0 at LOG = number of committed split records; records of
/// one line each follow: { node, new node, separator, node's new bitmap[4], 0 }.
const LOG_RECORDS: u64 = LOG + LINE;
const MAX_LOG_RECORDS: u64 = (LOG_SIZE - 2 * LINE) / LINE;
/// Update log (bits in different bitmap words): { node, old slot, new slot + 1 }.
const UPDATE_LOG: u64 = LOG + LOG_SIZE - LINE;

type Bitmap = [u64; 4];

#[inline]
fn bit_of(s: u64) -> (usize, u64) {
    (((s + 1) / 64) as usize, 1u64 << ((s + 1) % 64))
}

/// A node's bitmap and slot array as read.
struct View {
    bm: Bitmap,
    /// slots[0] = count, slots[1..=count] = entry slots in key order.
    slots: [u8; 256],
}

impl View {
    #[inline]
    fn count(&self) -> u64 {
        self.slots[0] as u64
    }
    #[inline]
    fn slot(&self, i: u64) -> u64 {
        self.slots[1 + i as usize] as u64
    }
}

struct State {
    root: u64,
    splits: u64,
    log_len: u64,
}

/// The wB+-tree engine.
pub struct WbTree<S: Space> {
    pool: Pool<S>,
    node_size: u64,
    /// Entry slots per node.
    m: u64,
    /// Offset of the entry array in a node.
    kv: u64,
    st: Mutex<State>,
}

impl<S: Space> WbTree<S> {
    /// A new, empty tree in a zeroed space.
    pub fn new(space: Arc<S>, node_size: u64) -> Result<WbTree<S>> {
        check_node_size("wbtree", node_size, 192)?;
        let pool = Pool::new(space)?;
        let mut m = 255.min(node_size / 16);
        while m > 2 && SLOTS + align_line(1 + m) + 16 * m > node_size {
            m -= 1;
        }
        let t = WbTree {
            pool,
            node_size,
            m,
            kv: SLOTS + align_line(1 + m),
            st: Mutex::new(State {
                root: 0,
                splits: 0,
                log_len: 0,
            }),
        };
        let root = t.pool.alloc(node_size);
        t.pool.space.zero(root, SLOTS + LINE);
        t.pool.store(root, 1);
        t.pool.persist(root, SLOTS + LINE, NODE_FLUSH, NODE_FENCE);
        t.pool.store(ROOT, root);
        t.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
        t.st.lock().root = root;
        Ok(t)
    }

    fn geometry(node_size: u64) -> (u64, u64) {
        let mut m = 255.min(node_size / 16);
        while m > 2 && SLOTS + align_line(1 + m) + 16 * m > node_size {
            m -= 1;
        }
        (m, SLOTS + align_line(1 + m))
    }

    /// Rebuilds the slot array of `n` from its bitmap (entries sorted by
    /// key), persists it, then sets the valid bit.
    fn rebuild_slots(sp: &S, n: u64, m: u64, kv: u64) {
        let bm: Vec<u64> = (0..4).map(|w| sp.load(n + 8 * w)).collect();
        let mut used: Vec<(u64, u64)> = (0..m)
            .filter(|&s| {
                let (w, bit) = bit_of(s);
                bm[w] & bit != 0
            })
            .map(|s| (sp.load(n + kv + 16 * s), s))
            .collect();
        used.sort_unstable();
        let mut slots = vec![used.len() as u8];
        slots.extend(used.iter().map(|&(_, s)| s as u8));
        sp.write(n + SLOTS, &slots);
        sp.persist(n + SLOTS, slots.len() as u64, NODE_FLUSH, NODE_FENCE);
        sp.store(n, bm[0] | 1);
        sp.persist(n, 8, BITMAP_FLUSH, BITMAP_FENCE);
    }

    /// Reopens a tree from a crashed image (see the module comment).
    pub fn recover(space: Arc<S>, node_size: u64) -> Result<WbTree<S>> {
        let (m, kv) = Self::geometry(node_size);
        let sp = &*space;
        // A two-word update: the new entry and slot array were persisted first.
        let un = sp.load(UPDATE_LOG);
        if un != 0 {
            let (old, new) = (sp.load(UPDATE_LOG + 8), sp.load(UPDATE_LOG + 16) - 1);
            let ((nw, nbit), (ow, obit)) = (bit_of(new), bit_of(old));
            sp.store(un + 8 * nw as u64, sp.load(un + 8 * nw as u64) | nbit);
            sp.store(un + 8 * ow as u64, sp.load(un + 8 * ow as u64) & !obit);
            sp.persist(un, 32, BITMAP_FLUSH, BITMAP_FENCE);
            sp.store(UPDATE_LOG, 0);
            sp.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
        }
        // Redo the committed split records.
        let nrec = sp.load(LOG).min(MAX_LOG_RECORDS);
        let mut recs = Vec::new();
        let mut redo = BTreeSet::new();
        for i in 0..nrec {
            let r = LOG_RECORDS + LINE * i;
            let (n, new, sep) = (sp.load(r), sp.load(r + 8), sp.load(r + 16));
            for w in 0..4 {
                sp.store(n + 8 * w, sp.load(r + 24 + 8 * w));
            }
            if sp.load(n + LEVEL) == 0 {
                sp.store(n + NEXT, new);
            }
            sp.persist(n, LINE, NODE_FLUSH, NODE_FENCE);
            redo.insert(n);
            recs.push((n, new, sep));
        }
        // Reachable nodes; invalid or redone slot arrays rebuilt.
        let root = sp.load(ROOT);
        let mut reachable = BTreeSet::new();
        let mut stack = vec![root];
        stack.extend(recs.iter().map(|r| r.1));
        while let Some(n) = stack.pop() {
            if !reachable.insert(n) {
                continue;
            }
            if sp.load(n) & 1 == 0 || redo.contains(&n) {
                Self::rebuild_slots(sp, n, m, kv);
            }
            if sp.load(n + LEVEL) != 0 {
                stack.push(sp.load(n + NEXT));
                let c = sp.read_u64(n + SLOTS) as u8 as u64;
                let mut slots = vec![0u8; c as usize];
                sp.read(n + SLOTS + 1, &mut slots);
                stack.extend(slots.iter().map(|&s| sp.load(n + kv + 16 * s as u64 + 8)));
            }
        }
        let pool = Pool::recover(space, &reachable)?;
        let t = WbTree {
            pool,
            node_size,
            m,
            kv,
            st: Mutex::new(State {
                root,
                splits: 0,
                log_len: 0,
            }),
        };
        // Link each split's new node into its parent, highest split first.
        let mut st = t.st.lock();
        for &(n, new, sep) in recs.iter().rev() {
            let level = t.level(n);
            if st.root == n {
                t.grow_root(&mut st, n, sep, new);
                continue;
            }
            let mut path = vec![st.root];
            while t.level(*path.last().unwrap()) > level + 1 {
                let c = t.child(*path.last().unwrap(), sep);
                path.push(c);
            }
            let parent = *path.last().unwrap();
            if t.child(parent, sep) != new {
                let d = path.len() - 1;
                t.insert_at(&mut st, &path, d, sep, new);
            }
        }
        st.log_len = nrec.max(1);
        t.truncate_log(&mut st);
        drop(st);
        Ok(t)
    }

    /// Entry slots per node.
    pub fn slots(&self) -> u64 {
        self.m
    }

    #[inline]
    fn entry(&self, n: u64, s: u64) -> u64 {
        n + self.kv + 16 * s
    }
    #[inline]
    fn key(&self, n: u64, s: u64) -> u64 {
        self.pool.load(self.entry(n, s))
    }
    #[inline]
    fn val(&self, n: u64, s: u64) -> u64 {
        self.pool.load(self.entry(n, s) + 8)
    }
    #[inline]
    fn level(&self, n: u64) -> u64 {
        self.pool.load(n + LEVEL)
    }

    fn view(&self, n: u64) -> View {
        let mut v = View {
            bm: [0; 4],
            slots: [0; 256],
        };
        for w in 0..4 {
            v.bm[w] = self.pool.load(n + 8 * w as u64);
        }
        debug_assert!(v.bm[0] & 1 == 1, "slot array of node {n} is invalid between operations");
        self.pool.space.read(n + SLOTS, &mut v.slots[..1]);
        let c = v.slots[0] as usize;
        self.pool.space.read(n + SLOTS + 1, &mut v.slots[1..1 + c]);
        v
    }

    /// Position in the slot array of the first key >= `key`, and whether it equals `key`.
    fn lower_bound(&self, n: u64, v: &View, key: u64) -> (u64, bool) {
        let (mut lo, mut hi) = (0, v.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(n, v.slot(mid)) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let eq = lo < v.count() && self.key(n, v.slot(lo)) == key;
        (lo, eq)
    }

    /// The child of inner node `n` covering `key`.
    fn child(&self, n: u64, key: u64) -> u64 {
        let v = self.view(n);
        let (i, eq) = self.lower_bound(n, &v, key);
        // The last entry with key <= `key`, else the leftmost child.
        let i = if eq { i + 1 } else { i };
        if i == 0 {
            self.pool.load(n + NEXT)
        } else {
            self.val(n, v.slot(i - 1))
        }
    }

    /// Root-to-leaf path for `key`.
    fn path(&self, root: u64, key: u64, out: &mut Vec<u64>) {
        out.clear();
        let mut n = root;
        loop {
            out.push(n);
            if self.level(n) == 0 {
                return;
            }
            n = self.child(n, key);
        }
    }

    fn free_slot(&self, bm: &Bitmap, prefer: Option<usize>) -> u64 {
        let free_in = |w: usize| {
            let mut free = !bm[w];
            if w == 0 {
                free &= !1;
            }
            while free != 0 {
                let b = free.trailing_zeros() as u64;
                let s = w as u64 * 64 + b;
                if s >= 1 && s - 1 < self.m {
                    return Some(s - 1);
                }
                free &= free - 1;
            }
            None
        };
        if let Some(w) = prefer {
            if let Some(s) = free_in(w) {
                return s;
            }
        }
        (0..4).find_map(free_in).expect("node with a free slot")
    }

    /// Clears the slot-array-valid bit and persists it (before the slot array changes).
    fn invalidate(&self, n: u64, bm: &mut Bitmap) {
        if bm[0] & 1 == 1 {
            bm[0] &= !1;
            self.pool.store(n, bm[0]);
            self.pool.persist(n, 8, INVALIDATE_FLUSH, INVALIDATE_FENCE);
        }
    }

    /// Publishes bitmap word `w` (already updated in `bm`) and the valid bit.
    fn publish(&self, n: u64, bm: &mut Bitmap, w: usize) {
        bm[0] |= 1;
        if w != 0 {
            self.pool.store(n + 8 * w as u64, bm[w]);
            self.pool.persist(n + 8 * w as u64, 8, BITMAP_FLUSH, BITMAP_FENCE);
        }
        self.pool.store(n, bm[0]);
        self.pool.persist(n, 8, BITMAP_FLUSH, BITMAP_FENCE);
    }

    /// Flushes slot-array bytes [from, to) (indices into the array, 0 = count)
    /// together with the count byte, each line once.
    fn flush_slots(&self, n: u64, from: u64, to: u64) {
        let base = n + SLOTS;
        if to <= from {
            self.pool.space.flush(base, 1, ENTRY_FLUSH);
            return;
        }
        let count_line = line_of(base);
        let first = line_of(base + from);
        if first == count_line {
            self.pool.space.flush(base, to, ENTRY_FLUSH);
        } else {
            self.pool.space.flush(base, 1, ENTRY_FLUSH);
            self.pool.space.flush(base + from, to - from, ENTRY_FLUSH);
        }
    }

    /// Inserts (key, val) into a node with a free slot (slot+bitmap insert).
    fn node_insert(&self, n: u64, key: u64, val: u64) {
        let mut v = self.view(n);
        let (r, _) = self.lower_bound(n, &v, key);
        let c = v.count();
        self.invalidate(n, &mut v.bm);
        let pos = self.free_slot(&v.bm, None);
        let e = self.entry(n, pos);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&key.to_le_bytes());
        b[8..].copy_from_slice(&val.to_le_bytes());
        self.pool.space.write(e, &b);
        // Shift the slot array right from position r and put `pos` there.
        let r1 = 1 + r as usize;
        let c1 = 1 + c as usize;
        v.slots.copy_within(r1..c1, r1 + 1);
        v.slots[r1] = pos as u8;
        v.slots[0] = (c + 1) as u8;
        self.pool.space.write(n + SLOTS + r1 as u64, &v.slots[r1..=c1]);
        self.pool.space.write(n + SLOTS, &v.slots[..1]);
        self.pool.space.flush(e, 16, ENTRY_FLUSH);
        self.flush_slots(n, r1 as u64, c1 as u64 + 1);
        self.pool.space.fence(ENTRY_FENCE);
        let (w, bit) = bit_of(pos);
        v.bm[w] |= bit;
        self.publish(n, &mut v.bm, w);
    }

    /// Removes the entry at slot-array position `r`.
    fn node_delete(&self, n: u64, mut v: View, r: u64) {
        let c = v.count();
        let pos = v.slot(r);
        self.invalidate(n, &mut v.bm);
        let r1 = 1 + r as usize;
        let c1 = 1 + c as usize;
        v.slots.copy_within(r1 + 1..c1, r1);
        v.slots[0] = (c - 1) as u8;
        if r1 + 1 < c1 {
            self.pool.space.write(n + SLOTS + r1 as u64, &v.slots[r1..c1 - 1]);
        }
        self.pool.space.write(n + SLOTS, &v.slots[..1]);
        self.flush_slots(n, r1 as u64, (c1 as u64 - 1).max(r1 as u64));
        self.pool.space.fence(ENTRY_FENCE);
        let (w, bit) = bit_of(pos);
        v.bm[w] &= !bit;
        self.publish(n, &mut v.bm, w);
    }

    /// Out-of-place update of the entry at slot-array position `r`.
    fn node_update(&self, n: u64, mut v: View, r: u64, key: u64, val: u64) {
        let old = v.slot(r);
        let (ow, obit) = bit_of(old);
        self.invalidate(n, &mut v.bm);
        let new = self.free_slot(&v.bm, Some(ow));
        let (nw, nbit) = bit_of(new);
        let e = self.entry(n, new);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&key.to_le_bytes());
        b[8..].copy_from_slice(&val.to_le_bytes());
        self.pool.space.write(e, &b);
        v.slots[1 + r as usize] = new as u8;
        self.pool.space.write(n + SLOTS + 1 + r, &[new as u8]);
        self.pool.space.flush(e, 16, ENTRY_FLUSH);
        self.pool.space.flush(n + SLOTS + 1 + r, 1, ENTRY_FLUSH);
        self.pool.space.fence(ENTRY_FENCE);
        if nw == ow {
            v.bm[nw] = (v.bm[nw] | nbit) & !obit;
            self.publish(n, &mut v.bm, nw);
        } else {
            let p = &self.pool;
            p.store(UPDATE_LOG + 8, old);
            p.store(UPDATE_LOG + 16, new + 1);
            p.persist(UPDATE_LOG + 8, 16, LOG_FLUSH, LOG_FENCE);
            p.store(UPDATE_LOG, n);
            p.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
            v.bm[nw] |= nbit;
            v.bm[ow] &= !obit;
            p.store(n + 8 * nw as u64, v.bm[nw]);
            p.store(n + 8 * ow as u64, v.bm[ow]);
            p.persist(n, 32, BITMAP_FLUSH, BITMAP_FENCE);
            self.publish(n, &mut v.bm, 0);
            p.store(UPDATE_LOG, 0);
            p.persist(UPDATE_LOG, 8, LOG_FLUSH, LOG_FENCE);
        }
    }

    /// Splits full node `n` under a redo record; returns (separator, new node).
    fn split(&self, st: &mut State, n: u64) -> (u64, u64) {
        let p = &self.pool;
        let v = self.view(n);
        let c = v.count();
        let level = self.level(n);
        let (keep, from, sep, leftmost) = if level == 0 {
            let h = c / 2;
            (h, h, self.key(n, v.slot(h)), p.load(n + NEXT))
        } else {
            let mid = c / 2;
            let s = v.slot(mid);
            (mid, mid + 1, self.key(n, s), self.val(n, s))
        };
        let moved = c - from;
        // The new node: sorted, slot array valid.
        let new = p.alloc(self.node_size);
        let mut buf = vec![0u8; self.node_size as usize];
        let mut bm: Bitmap = [1, 0, 0, 0];
        for j in 0..moved {
            let (w, bit) = bit_of(j);
            bm[w] |= bit;
            let s = v.slot(from + j);
            let o = (self.kv + 16 * j) as usize;
            buf[o..o + 8].copy_from_slice(&self.key(n, s).to_le_bytes());
            buf[o + 8..o + 16].copy_from_slice(&self.val(n, s).to_le_bytes());
            buf[(SLOTS + 1 + j) as usize] = j as u8;
        }
        buf[SLOTS as usize] = moved as u8;
        for (w, word) in bm.iter().enumerate() {
            buf[8 * w..8 * w + 8].copy_from_slice(&word.to_le_bytes());
        }
        buf[NEXT as usize..NEXT as usize + 8].copy_from_slice(&leftmost.to_le_bytes());
        buf[LEVEL as usize..LEVEL as usize + 8].copy_from_slice(&level.to_le_bytes());
        p.space.write(new, &buf);
        p.persist(new, self.node_size, NODE_FLUSH, NODE_FENCE);
        // The node keeps the first `keep` entries of its slot array.
        let mut kept: Bitmap = [1, 0, 0, 0];
        for j in 0..keep {
            let (w, bit) = bit_of(v.slot(j));
            kept[w] |= bit;
        }
        // Redo record, committed by the log length.
        assert!(st.log_len < MAX_LOG_RECORDS, "wbtree: redo log full");
        let rec = LOG_RECORDS + LINE * st.log_len;
        p.store(rec, n);
        p.store(rec + 8, new);
        p.store(rec + 16, sep);
        for (w, &word) in kept.iter().enumerate() {
            p.store(rec + 24 + 8 * w as u64, word);
        }
        p.persist(rec, LINE, LOG_FLUSH, LOG_FENCE);
        st.log_len += 1;
        p.store(LOG, st.log_len);
        p.persist(LOG, 8, LOG_FLUSH, LOG_FENCE);
        // Apply: bitmap, slot count, sibling.
        for (w, &word) in kept.iter().enumerate() {
            p.store(n + 8 * w as u64, word);
        }
        if level == 0 {
            p.store(n + NEXT, new);
        }
        p.space.write(n + SLOTS, &[keep as u8]);
        p.space.flush(n, LINE, NODE_FLUSH);
        p.space.flush(n + SLOTS, 1, NODE_FLUSH);
        p.space.fence(NODE_FENCE);
        if level == 0 {
            st.splits += 1;
        }
        (sep, new)
    }

    /// Inserts (key, val) into `path[depth]`, splitting upward as needed.
    fn insert_at(&self, st: &mut State, path: &[u64], depth: usize, key: u64, val: u64) {
        let n = path[depth];
        let c = self.pool.space.read_u64(n + SLOTS) as u8 as u64;
        if c < self.m {
            self.node_insert(n, key, val);
            return;
        }
        let (sep, new) = self.split(st, n);
        let target = if key >= sep { new } else { n };
        self.node_insert(target, key, val);
        if depth == 0 {
            self.grow_root(st, n, sep, new);
        } else {
            self.insert_at(st, path, depth - 1, sep, new);
        }
    }

    fn put(&self, st: &mut State, key: u64, val: u64, update_only: bool) -> bool {
        let mut path = Vec::with_capacity(8);
        self.path(st.root, key, &mut path);
        let leaf = *path.last().unwrap();
        let v = self.view(leaf);
        let (r, eq) = self.lower_bound(leaf, &v, key);
        if eq {
            if v.count() == self.m {
                // No free slot for the out-of-place update: split first.
                let (sep, new) = self.split(st, leaf);
                if path.len() == 1 {
                    self.grow_root(st, leaf, sep, new);
                } else {
                    let d = path.len() - 2;
                    self.insert_at(st, &path, d, sep, new);
                }
                self.truncate_log(st);
                return self.put(st, key, val, update_only);
            }
            self.node_update(leaf, v, r, key, val);
            return true;
        }
        if update_only {
            return false;
        }
        let d = path.len() - 1;
        self.insert_at(st, &path, d, key, val);
        self.truncate_log(st);
        false
    }

    /// A new root over `n` and its new sibling: written and flushed, then the root word.
    fn grow_root(&self, st: &mut State, n: u64, sep: u64, new: u64) {
        let r = self.pool.alloc(self.node_size);
        let mut buf = vec![0u8; (self.kv + 16) as usize];
        let bm: Bitmap = [1 | bit_of(0).1, 0, 0, 0];
        buf[..8].copy_from_slice(&bm[0].to_le_bytes());
        buf[NEXT as usize..NEXT as usize + 8].copy_from_slice(&n.to_le_bytes());
        buf[LEVEL as usize..LEVEL as usize + 8].copy_from_slice(&(self.level(n) + 1).to_le_bytes());
        buf[SLOTS as usize] = 1;
        let o = self.kv as usize;
        buf[o..o + 8].copy_from_slice(&sep.to_le_bytes());
        buf[o + 8..o + 16].copy_from_slice(&new.to_le_bytes());
        self.pool.space.write(r, &buf);
        self.pool.persist(r, self.node_size, NODE_FLUSH, NODE_FENCE);
        self.pool.store(ROOT, r);
        self.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
        st.root = r;
    }

    fn truncate_log(&self, st: &mut State) {
        if st.log_len > 0 {
            st.log_len = 0;
            self.pool.store(LOG, 0);
            self.pool.persist(LOG, 8, LOG_FLUSH, LOG_FENCE);
        }
    }

    fn remove(&self, st: &mut State, key: u64) -> bool {
        let mut path = Vec::with_capacity(8);
        self.path(st.root, key, &mut path);
        let leaf = *path.last().unwrap();
        let v = self.view(leaf);
        let (r, eq) = self.lower_bound(leaf, &v, key);
        if !eq {
            return false;
        }
        self.node_delete(leaf, v, r);
        true
    }

    fn find_leaf(&self, root: u64, key: u64) -> u64 {
        let mut n = root;
        while self.level(n) != 0 {
            n = self.child(n, key);
        }
        n
    }

    fn get(&self, st: &State, key: u64) -> Option<u64> {
        let leaf = self.find_leaf(st.root, key);
        let v = self.view(leaf);
        let (r, eq) = self.lower_bound(leaf, &v, key);
        eq.then(|| self.val(leaf, v.slot(r)))
    }

    fn scan_from(&self, st: &State, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let mut leaf = self.find_leaf(st.root, start);
        let mut got = 0;
        let mut first = true;
        while leaf != 0 && got < n {
            let v = self.view(leaf);
            let from = if first { self.lower_bound(leaf, &v, start).0 } else { 0 };
            first = false;
            for i in from..v.count() {
                if got == n {
                    break;
                }
                let s = v.slot(i);
                out.push((self.key(leaf, s), self.val(leaf, s)));
                got += 1;
            }
            leaf = self.pool.load(leaf + NEXT);
        }
    }
}

single_lock_bench_index!(WbTree, "wbtree", "slot+bitmap");
