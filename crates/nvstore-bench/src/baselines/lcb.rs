//! LCB+Tree: the log-based consistent B+-tree of the NV-Tree paper's
//! evaluation (J. Yang, Q. Wei, C. Wang, C. Chen, K. L. Yong, B. He,
//! "NV-Tree: A Consistent and Workload-adaptive Tree Structure for
//! Non-volatile Memory", IEEE TC 2016 / FAST'15, §3.1 and §6): a standard
//! B+-tree with sorted nodes, all in the pool, made consistent by undo
//! logging: "before modifying a node, its original copy is logged and
//! FLUSHed. The modified part of it is then FLUSHed to make the changes
//! persistent." No optimisation (such as merging several modifications of a
//! node into one flush) beyond logging each node once per operation.
//!
//! Node layout (`node_size` bytes, `m = (node_size - 64) / 16` entries):
//!
//! ```text
//! [0, 8)     count: entries in use
//! [8, 16)    level (0 = leaf)
//! [16, 24)   next: right sibling (leaves; 0 = last)
//! [24, 32)   leftmost child (inner nodes: keys < entries[0].key)
//! [64, ..)   entries[m]: { u64 key, u64 value | child }, sorted by key;
//!            an inner entry's child covers keys >= its key
//! ```
//!
//! Undo log (the pool's LOG area, then log blocks from the allocator):
//!
//! ```text
//! LOG + 0            u64 committed records (0 = no operation in flight)
//! LOG + 8 (1 + i)    offset of log block i (allocated on first use, persisted)
//! log block i        line 0: { u64 target offset, u64 length }; [64, 64 + length): the bytes
//! ```
//!
//! Write path: for each node an operation modifies (once per node per
//! operation), the used part of the node (header + `count` entries) is
//! copied into the next log block, flushed and fenced, then the record count
//! is stored, flushed and fenced; the node is modified in place and the
//! changed lines are flushed and fenced. A node allocated by the operation
//! is not logged (nothing reaches it until a logged node links it). When the
//! operation is complete the record count is set to 0 (flush, fence): the
//! commit. Splits log the node, write the new node, and insert the
//! separator into the parent (logged in turn); a new root is linked by the
//! root word, logged as an 8-byte record.
//!
//! Recovery ([`Lcb::recover`]): the committed records are copied back in
//! reverse order (persisted), the count is reset, and the allocator is
//! rebuilt from the nodes reachable from the root plus the log blocks.
//!
//! Simplifications: one writer at a time, readers under the same lock;
//! deletes never merge nodes.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::pool::{check_node_size, line_of, Pool, LOG, LOG_SIZE, ROOT};
use nvstore::pmem::{Point, Space, LINE};
use nvstore::Result;

const LOG_FLUSH: Point = Point::new("lcb.log.flush");
const LOG_FENCE: Point = Point::new("lcb.log.fence");
const COMMIT_FLUSH: Point = Point::new("lcb.commit.flush");
const COMMIT_FENCE: Point = Point::new("lcb.commit.fence");
const NODE_FLUSH: Point = Point::new("lcb.node.flush");
const NODE_FENCE: Point = Point::new("lcb.node.fence");
const ROOT_FLUSH: Point = Point::new("lcb.root.flush");
const ROOT_FENCE: Point = Point::new("lcb.root.fence");

const COUNT: u64 = 0;
const LEVEL: u64 = 8;
const NEXT: u64 = 16;
const LEFTMOST: u64 = 24;
const ENTRIES: u64 = 64;

/// Log directory: record count, then block offsets.
const LOG_COUNT: u64 = LOG;
const LOG_DIR: u64 = LOG + 8;
const MAX_RECORDS: u64 = LOG_SIZE / 8 - 1;

struct State {
    root: u64,
    splits: u64,
    /// Records logged by the operation in flight.
    log_len: u64,
    /// Nodes logged (or allocated) by the operation in flight.
    logged: Vec<u64>,
    /// Log blocks allocated so far.
    blocks: Vec<u64>,
}

/// The LCB+Tree engine.
pub struct Lcb<S: Space> {
    pool: Pool<S>,
    node_size: u64,
    m: u64,
    st: Mutex<State>,
}

impl<S: Space> Lcb<S> {
    /// A new, empty tree in a zeroed space.
    pub fn new(space: Arc<S>, node_size: u64) -> Result<Lcb<S>> {
        check_node_size("lcb", node_size, 256)?;
        let pool = Pool::new(space)?;
        let t = Lcb {
            pool,
            node_size,
            m: (node_size - ENTRIES) / 16,
            st: Mutex::new(State {
                root: 0,
                splits: 0,
                log_len: 0,
                logged: Vec::new(),
                blocks: Vec::new(),
            }),
        };
        let root = t.pool.alloc(node_size);
        t.pool.space.zero(root, ENTRIES);
        t.pool.persist(root, ENTRIES, NODE_FLUSH, NODE_FENCE);
        t.pool.store(ROOT, root);
        t.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
        t.st.lock().root = root;
        Ok(t)
    }

    /// Reopens a tree from a crashed image: rolls back the operation in
    /// flight with the undo log, then rebuilds the allocator.
    pub fn recover(space: Arc<S>, node_size: u64) -> Result<Lcb<S>> {
        let n = space.load(LOG_COUNT);
        for i in (0..n.min(MAX_RECORDS)).rev() {
            let blk = space.load(LOG_DIR + 8 * i);
            let (off, len) = (space.load(blk), space.load(blk + 8));
            let mut buf = vec![0u8; len as usize];
            space.read(blk + LINE, &mut buf);
            space.write(off, &buf);
            space.flush(off, len, LOG_FLUSH);
        }
        space.fence(LOG_FENCE);
        space.store(LOG_COUNT, 0);
        space.persist(LOG_COUNT, 8, COMMIT_FLUSH, COMMIT_FENCE);
        let mut reachable = BTreeSet::new();
        let mut blocks = Vec::new();
        for i in 0..MAX_RECORDS {
            let b = space.load(LOG_DIR + 8 * i);
            if b == 0 {
                break;
            }
            reachable.insert(b);
            blocks.push(b);
        }
        let root = space.load(ROOT);
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            reachable.insert(n);
            if space.load(n + LEVEL) != 0 {
                stack.push(space.load(n + LEFTMOST));
                for i in 0..space.load(n + COUNT) {
                    stack.push(space.load(n + ENTRIES + 16 * i + 8));
                }
            }
        }
        let pool = Pool::recover(space, &reachable)?;
        Ok(Lcb {
            pool,
            node_size,
            m: (node_size - ENTRIES) / 16,
            st: Mutex::new(State {
                root,
                splits: 0,
                log_len: 0,
                logged: Vec::new(),
                blocks,
            }),
        })
    }

    #[inline]
    fn count(&self, n: u64) -> u64 {
        self.pool.load(n + COUNT)
    }
    #[inline]
    fn key(&self, n: u64, i: u64) -> u64 {
        self.pool.load(n + ENTRIES + 16 * i)
    }
    #[inline]
    fn val(&self, n: u64, i: u64) -> u64 {
        self.pool.load(n + ENTRIES + 16 * i + 8)
    }
    #[inline]
    fn level(&self, n: u64) -> u64 {
        self.pool.load(n + LEVEL)
    }

    /// Undo-logs bytes `[off, off + len)` unless this operation already did.
    fn log_range(&self, st: &mut State, off: u64, len: u64) {
        if st.logged.contains(&off) {
            return;
        }
        st.logged.push(off);
        let p = &self.pool;
        let i = st.log_len;
        assert!(i < MAX_RECORDS, "lcb: undo log full");
        if i as usize == st.blocks.len() {
            // A new log block, persisted before the directory names it.
            let b = p.alloc(self.node_size + LINE);
            st.blocks.push(b);
            p.store(LOG_DIR + 8 * i, b);
            p.persist(LOG_DIR + 8 * i, 8, LOG_FLUSH, LOG_FENCE);
        }
        let b = st.blocks[i as usize];
        p.store(b, off);
        p.store(b + 8, len);
        let mut buf = vec![0u8; len as usize];
        p.space.read(off, &mut buf);
        p.space.write(b + LINE, &buf);
        p.persist(b, LINE + len, LOG_FLUSH, LOG_FENCE);
        st.log_len += 1;
        p.store(LOG_COUNT, st.log_len);
        p.persist(LOG_COUNT, 8, LOG_FLUSH, LOG_FENCE);
    }

    /// Logs the used part of node `n` (header and entries).
    fn log_node(&self, st: &mut State, n: u64) {
        let len = ENTRIES + 16 * self.count(n);
        self.log_range(st, n, len);
    }

    /// Commits the operation: the undo log is emptied.
    fn commit(&self, st: &mut State) {
        if st.log_len > 0 {
            self.pool.store(LOG_COUNT, 0);
            self.pool.persist(LOG_COUNT, 8, COMMIT_FLUSH, COMMIT_FENCE);
            st.log_len = 0;
        }
        st.logged.clear();
    }

    /// Flushes the header line and entries `[from, to)` of `n`, then fences.
    fn flush_node(&self, n: u64, from: u64, to: u64) {
        let s = &self.pool.space;
        s.flush(n, 8, NODE_FLUSH);
        if to > from {
            let a = n + ENTRIES + 16 * from;
            let b = n + ENTRIES + 16 * to;
            // The header line was flushed already.
            let a = a.max(n + LINE);
            if b > a {
                s.flush(line_of(a), b - line_of(a), NODE_FLUSH);
            }
        }
        s.fence(NODE_FENCE);
    }

    /// Index of the first entry with key >= `key`, and whether it equals.
    fn lower_bound(&self, n: u64, key: u64) -> (u64, bool) {
        let (mut lo, mut hi) = (0, self.count(n));
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(n, mid) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo, lo < self.count(n) && self.key(n, lo) == key)
    }

    fn child(&self, n: u64, key: u64) -> u64 {
        let (i, eq) = self.lower_bound(n, key);
        let i = if eq { i + 1 } else { i };
        if i == 0 {
            self.pool.load(n + LEFTMOST)
        } else {
            self.val(n, i - 1)
        }
    }

    fn path(&self, root: u64, key: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(8);
        let mut n = root;
        loop {
            out.push(n);
            if self.level(n) == 0 {
                return out;
            }
            n = self.child(n, key);
        }
    }

    /// Inserts (key, val) at index `i` of non-full node `n` (logged first).
    fn node_insert(&self, st: &mut State, n: u64, i: u64, key: u64, val: u64) {
        self.log_node(st, n);
        let c = self.count(n);
        let at = n + ENTRIES + 16 * i;
        if i < c {
            let mut buf = vec![0u8; (16 * (c - i)) as usize];
            self.pool.space.read(at, &mut buf);
            self.pool.space.write(at + 16, &buf);
        }
        self.pool.store(at, key);
        self.pool.store(at + 8, val);
        self.pool.store(n + COUNT, c + 1);
        self.flush_node(n, i, c + 1);
    }

    /// Splits full node `n`; returns (separator, new right node).
    fn split(&self, st: &mut State, n: u64) -> (u64, u64) {
        self.log_node(st, n);
        let p = &self.pool;
        let c = self.count(n);
        let level = self.level(n);
        let new = p.alloc(self.node_size);
        st.logged.push(new);
        let (keep, from, sep, leftmost) = if level == 0 {
            let h = c / 2;
            (h, h, self.key(n, h), 0)
        } else {
            let mid = c / 2;
            (mid, mid + 1, self.key(n, mid), self.val(n, mid))
        };
        let moved = c - from;
        let mut buf = vec![0u8; (ENTRIES + 16 * moved) as usize];
        p.space.read(n + ENTRIES + 16 * from, &mut buf[ENTRIES as usize..]);
        buf[..8].copy_from_slice(&moved.to_le_bytes());
        buf[8..16].copy_from_slice(&level.to_le_bytes());
        let next = if level == 0 { p.load(n + NEXT) } else { 0 };
        buf[16..24].copy_from_slice(&next.to_le_bytes());
        buf[24..32].copy_from_slice(&leftmost.to_le_bytes());
        p.space.write(new, &buf);
        p.space.flush(new, buf.len() as u64, NODE_FLUSH);
        p.store(n + COUNT, keep);
        if level == 0 {
            p.store(n + NEXT, new);
            st.splits += 1;
        }
        self.flush_node(n, 0, 0);
        (sep, new)
    }

    /// Inserts (key, val) into `path[depth]`, splitting upward as needed.
    fn insert_at(&self, st: &mut State, path: &[u64], depth: usize, key: u64, val: u64) {
        let n = path[depth];
        if self.count(n) < self.m {
            let (i, _) = self.lower_bound(n, key);
            self.node_insert(st, n, i, key, val);
            return;
        }
        let (sep, new) = self.split(st, n);
        let target = if key >= sep { new } else { n };
        let (i, _) = self.lower_bound(target, key);
        self.node_insert(st, target, i, key, val);
        if depth == 0 {
            // A new root, then the (logged) root word.
            let r = self.pool.alloc(self.node_size);
            let mut buf = [0u8; (ENTRIES + 16) as usize];
            buf[..8].copy_from_slice(&1u64.to_le_bytes());
            buf[8..16].copy_from_slice(&(self.level(n) + 1).to_le_bytes());
            buf[24..32].copy_from_slice(&n.to_le_bytes());
            buf[64..72].copy_from_slice(&sep.to_le_bytes());
            buf[72..80].copy_from_slice(&new.to_le_bytes());
            self.pool.space.write(r, &buf);
            self.pool.persist(r, buf.len() as u64, NODE_FLUSH, NODE_FENCE);
            self.log_range(st, ROOT, 8);
            self.pool.store(ROOT, r);
            self.pool.persist(ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
            st.root = r;
        } else {
            self.insert_at(st, path, depth - 1, sep, new);
        }
    }

    fn put(&self, st: &mut State, key: u64, val: u64, update_only: bool) -> bool {
        let path = self.path(st.root, key);
        let leaf = *path.last().unwrap();
        let (i, eq) = self.lower_bound(leaf, key);
        if eq {
            self.log_node(st, leaf);
            let at = leaf + ENTRIES + 16 * i + 8;
            self.pool.store(at, val);
            self.pool.persist(at, 8, NODE_FLUSH, NODE_FENCE);
            self.commit(st);
            return true;
        }
        if update_only {
            return false;
        }
        self.insert_at(st, &path, path.len() - 1, key, val);
        self.commit(st);
        false
    }

    fn remove(&self, st: &mut State, key: u64) -> bool {
        let leaf = *self.path(st.root, key).last().unwrap();
        let (i, eq) = self.lower_bound(leaf, key);
        if !eq {
            return false;
        }
        self.log_node(st, leaf);
        let c = self.count(leaf);
        let at = leaf + ENTRIES + 16 * i;
        if i + 1 < c {
            let mut buf = vec![0u8; (16 * (c - i - 1)) as usize];
            self.pool.space.read(at + 16, &mut buf);
            self.pool.space.write(at, &buf);
        }
        self.pool.store(leaf + COUNT, c - 1);
        self.flush_node(leaf, i, c - 1);
        self.commit(st);
        true
    }

    fn get(&self, st: &State, key: u64) -> Option<u64> {
        let leaf = *self.path(st.root, key).last().unwrap();
        let (i, eq) = self.lower_bound(leaf, key);
        eq.then(|| self.val(leaf, i))
    }

    fn scan_from(&self, st: &State, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let mut leaf = *self.path(st.root, start).last().unwrap();
        let mut i = self.lower_bound(leaf, start).0;
        let mut got = 0;
        while leaf != 0 && got < n {
            let c = self.count(leaf);
            while i < c && got < n {
                out.push((self.key(leaf, i), self.val(leaf, i)));
                got += 1;
                i += 1;
            }
            leaf = self.pool.load(leaf + NEXT);
            i = 0;
        }
    }
}

single_lock_bench_index!(Lcb, "lcb", "sorted+undo");
