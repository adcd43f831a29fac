//! CDDS-Tree: the CDDS B-Tree of S. Venkataraman, N. Tolia, P. Ranganathan,
//! R. H. Campbell, "Consistent and Durable Data Structures for Non-Volatile
//! Byte-Addressable Memory", FAST 2011 (NV-Tree's main baseline).
//!
//! A multi-version B+-tree, every node in the pool. Each entry carries the
//! version range `[start, end)` in which it is live; a global version
//! counter is bumped (one atomic store, flushed and fenced) per operation,
//! which commits everything the operation wrote at that version. Entries in a
//! node stay sorted by key (versions of one key by start). An insert shifts
//! the larger entries right, each one flushed; a delete only sets the entry's
//! end version; an update ends the old entry and inserts a new one. A full
//! node is never changed in place: its live entries (dead ones are dropped:
//! the dead-entry cleanup, done eagerly because no old version is ever read
//! here) and the new entry are written into one new node, or two if they do
//! not fit in 3/4 of one, and the parent's entry for the old node is ended
//! while entries for the new nodes are inserted (recursively). Old nodes are
//! freed once the operation has committed.
//!
//! Node layout (`node_size` bytes, `m = (node_size - 64) / 32` entries):
//!
//! ```text
//! [0, 8)    count: slots in use (live, dead or invalid)
//! [8, 16)   level (0 = leaf)
//! [64, ..)  entries[m]: { u64 key, u64 value | child, u64 start, u64 end }
//!           start = version << 8 | sequence within the operation (unique),
//!           u64::MAX = invalid slot; end = version, u64::MAX = live.
//!           An inner entry's child covers keys from its key up to the next
//!           live entry's key; the first live entry of an inner node has key 0.
//! ```
//!
//! Root area: `ROOT` root node, `ROOT + 8` committed version, `ROOT + 16`
//! previous root and `ROOT + 24` the version that replaced it.
//!
//! Failure atomicity of the shift: only 8-byte stores are atomic, so a
//! 32-byte entry copied over a slot could be torn. A shift copies entry
//! `t - 1` into slot `t` (which holds a duplicate of slot `t + 1`) in two
//! persisted steps: key, value and end first, then the start word. Starts are
//! unique, so a slot whose start equals its right neighbour's is a stale
//! duplicate or a torn copy, and is ignored. This costs two flushes (and
//! fences) per shifted entry where the paper counts one flush per entry.
//!
//! Recovery ([`Cdds::recover`]): entries started after the committed version
//! are invalidated, ended ones made live again, stale duplicates invalidated,
//! the root word restored if a new root was not committed, and the allocator
//! rebuilt from the reachable nodes. Readers see an entry iff its start
//! version is <= the committed version and its end version is above it.
//!
//! Simplifications: one writer at a time, readers under the same lock; no
//! concurrent readers of old versions, so dead entries are dropped at the
//! next rewrite of their node rather than by a background collector.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::pool::{check_node_size, Pool, ROOT};
use nvstore::pmem::{Point, Space};
use nvstore::Result;

const ENTRY_FLUSH: Point = Point::new("cdds.entry.flush");
const ENTRY_FENCE: Point = Point::new("cdds.entry.fence");
const START_FLUSH: Point = Point::new("cdds.start.flush");
const START_FENCE: Point = Point::new("cdds.start.fence");
const END_FLUSH: Point = Point::new("cdds.end.flush");
const END_FENCE: Point = Point::new("cdds.end.fence");
const COUNT_FLUSH: Point = Point::new("cdds.count.flush");
const COUNT_FENCE: Point = Point::new("cdds.count.fence");
const NODE_FLUSH: Point = Point::new("cdds.node.flush");
const NODE_FENCE: Point = Point::new("cdds.node.fence");
const ROOT_FLUSH: Point = Point::new("cdds.root.flush");
const ROOT_FENCE: Point = Point::new("cdds.root.fence");
const VERSION_FLUSH: Point = Point::new("cdds.version.flush");
const VERSION_FENCE: Point = Point::new("cdds.version.fence");

const COUNT: u64 = 0;
const LEVEL: u64 = 8;
const ENTRIES: u64 = 64;
const ESIZE: u64 = 32;

const ROOT_NODE: u64 = ROOT;
const VERSION: u64 = ROOT + 8;
const PREV_ROOT: u64 = ROOT + 16;
const ROOT_CHANGED: u64 = ROOT + 24;

const INVALID: u64 = u64::MAX;
const LIVE: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    key: u64,
    val: u64,
    start: u64,
    end: u64,
}

impl Entry {
    #[inline]
    fn version(&self) -> u64 {
        self.start >> 8
    }
    /// Live in the committed version `gv`.
    #[inline]
    fn visible(&self, gv: u64) -> bool {
        self.start != INVALID && self.version() <= gv && self.end > gv
    }
    /// Live for the writer of version `v` (ended in `v` means dead).
    #[inline]
    fn alive(&self, v: u64) -> bool {
        self.start != INVALID && self.version() <= v && self.end == LIVE
    }
}

struct State {
    root: u64,
    /// Committed version.
    gv: u64,
    /// Sequence of the next entry created by the operation in flight.
    seq: u64,
    /// Nodes replaced by the operation in flight (freed at commit).
    dead: Vec<u64>,
    splits: u64,
}

impl State {
    fn v(&self) -> u64 {
        self.gv + 1
    }
    fn next_start(&mut self) -> u64 {
        let s = (self.v() << 8) | self.seq;
        self.seq += 1;
        assert!(self.seq < 256, "cdds: too many entries in one operation");
        s
    }
}

/// The CDDS-Tree engine.
pub struct Cdds<S: Space> {
    pool: Pool<S>,
    node_size: u64,
    m: u64,
    st: Mutex<State>,
}

impl<S: Space> Cdds<S> {
    /// A new, empty tree in a zeroed space.
    pub fn new(space: Arc<S>, node_size: u64) -> Result<Cdds<S>> {
        check_node_size("cdds", node_size, 256)?;
        let pool = Pool::new(space)?;
        let t = Cdds {
            pool,
            node_size,
            m: (node_size - ENTRIES) / ESIZE,
            st: Mutex::new(State {
                root: 0,
                gv: 1,
                seq: 0,
                dead: Vec::new(),
                splits: 0,
            }),
        };
        let root = t.pool.alloc(node_size);
        t.pool.space.zero(root, ENTRIES);
        t.pool.persist(root, ENTRIES, NODE_FLUSH, NODE_FENCE);
        t.pool.store(VERSION, 1);
        t.pool.store(ROOT_NODE, root);
        t.pool.persist(ROOT, 32, ROOT_FLUSH, ROOT_FENCE);
        t.st.lock().root = root;
        Ok(t)
    }

    /// Reopens a tree from a crashed image (see the module comment).
    pub fn recover(space: Arc<S>, node_size: u64) -> Result<Cdds<S>> {
        let gv = space.load(VERSION);
        if space.load(ROOT_CHANGED) > gv {
            space.store(ROOT_NODE, space.load(PREV_ROOT));
            space.store(ROOT_CHANGED, 0);
            space.persist(ROOT, 32, ROOT_FLUSH, ROOT_FENCE);
        }
        let root = space.load(ROOT_NODE);
        let mut reachable = BTreeSet::new();
        let mut stack = vec![root];
        let read = |space: &S, n: u64, i: u64| -> Entry {
            let at = n + ENTRIES + ESIZE * i;
            Entry {
                key: space.load(at),
                val: space.load(at + 8),
                start: space.load(at + 16),
                end: space.load(at + 24),
            }
        };
        while let Some(n) = stack.pop() {
            if !reachable.insert(n) {
                continue;
            }
            let c = space.load(n + COUNT);
            for i in 0..c {
                let at = n + ENTRIES + ESIZE * i;
                let e = read(&space, n, i);
                let dup = i + 1 < c && read(&space, n, i + 1).start == e.start;
                if e.start != INVALID && (dup || e.version() > gv) {
                    space.store(at + 16, INVALID);
                    space.persist(at + 16, 8, START_FLUSH, START_FENCE);
                    continue;
                }
                if e.end != LIVE && e.end > gv {
                    space.store(at + 24, LIVE);
                    space.persist(at + 24, 8, END_FLUSH, END_FENCE);
                }
                if space.load(n + LEVEL) != 0 && e.visible(gv) {
                    stack.push(e.val);
                }
            }
        }
        let pool = Pool::recover(space, &reachable)?;
        Ok(Cdds {
            pool,
            node_size,
            m: (node_size - ENTRIES) / ESIZE,
            st: Mutex::new(State {
                root,
                gv,
                seq: 0,
                dead: Vec::new(),
                splits: 0,
            }),
        })
    }

    #[inline]
    fn count(&self, n: u64) -> u64 {
        self.pool.load(n + COUNT)
    }
    #[inline]
    fn level(&self, n: u64) -> u64 {
        self.pool.load(n + LEVEL)
    }
    #[inline]
    fn slot(&self, n: u64, i: u64) -> u64 {
        n + ENTRIES + ESIZE * i
    }
    fn entry(&self, n: u64, i: u64) -> Entry {
        let at = self.slot(n, i);
        Entry {
            key: self.pool.load(at),
            val: self.pool.load(at + 8),
            start: self.pool.load(at + 16),
            end: self.pool.load(at + 24),
        }
    }
    fn entries(&self, n: u64) -> Vec<Entry> {
        (0..self.count(n)).map(|i| self.entry(n, i)).collect()
    }

    /// The child of inner node `n` covering `key`: the last visible entry with key <= `key`.
    fn child(&self, n: u64, key: u64, gv: u64) -> u64 {
        let es = self.entries(n);
        let ub = es.partition_point(|e| e.key <= key);
        es[..ub]
            .iter()
            .rev()
            .find(|e| e.visible(gv))
            .expect("an inner node has a live entry with key 0")
            .val
    }

    fn path(&self, root: u64, key: u64, gv: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(8);
        let mut n = root;
        loop {
            out.push(n);
            if self.level(n) == 0 {
                return out;
            }
            n = self.child(n, key, gv);
        }
    }

    /// Writes the key, value and end words of slot `i`, persisted.
    fn write_body(&self, n: u64, i: u64, e: &Entry) {
        let at = self.slot(n, i);
        self.pool.store(at, e.key);
        self.pool.store(at + 8, e.val);
        self.pool.store(at + 24, e.end);
        self.pool.persist(at, ESIZE, ENTRY_FLUSH, ENTRY_FENCE);
    }

    /// Writes all of slot `i` (beyond the count: not yet visible), persisted.
    fn write_full(&self, n: u64, i: u64, e: &Entry) {
        let at = self.slot(n, i);
        self.pool.store(at, e.key);
        self.pool.store(at + 8, e.val);
        self.pool.store(at + 16, e.start);
        self.pool.store(at + 24, e.end);
        self.pool.persist(at, ESIZE, ENTRY_FLUSH, ENTRY_FENCE);
    }

    fn write_start(&self, n: u64, i: u64, start: u64) {
        let at = self.slot(n, i) + 16;
        self.pool.store(at, start);
        self.pool.persist(at, 8, START_FLUSH, START_FENCE);
    }

    /// Inserts `e` into non-full node `n` in sorted position by shifting.
    fn shift_insert(&self, n: u64, e: Entry) {
        let c = self.count(n);
        let es = self.entries(n);
        let pos = es.partition_point(|x| x.key <= e.key) as u64;
        if pos == c {
            // Append: the slot is beyond the count until the count is stored.
            self.write_full(n, c, &e);
        } else {
            // Slot c becomes a full copy of slot c - 1 before the count covers it.
            self.write_full(n, c, &es[c as usize - 1]);
        }
        self.pool.store(n + COUNT, c + 1);
        self.pool.persist(n + COUNT, 8, COUNT_FLUSH, COUNT_FENCE);
        if pos == c {
            return;
        }
        for t in (pos + 1..c).rev() {
            let src = &es[t as usize - 1];
            self.write_body(n, t, src);
            self.write_start(n, t, src.start);
        }
        self.write_body(n, pos, &e);
        self.write_start(n, pos, e.start);
    }

    /// Ends (in version `v`) the entry of `n` at slot `i`.
    fn end_entry(&self, n: u64, i: u64, v: u64) {
        let at = self.slot(n, i) + 24;
        self.pool.store(at, v);
        self.pool.persist(at, 8, END_FLUSH, END_FENCE);
    }

    /// A new node holding `es` (sorted), persisted.
    fn write_node(&self, level: u64, es: &[Entry]) -> u64 {
        let n = self.pool.alloc(self.node_size);
        let mut buf = vec![0u8; (ENTRIES + ESIZE * es.len() as u64) as usize];
        buf[..8].copy_from_slice(&(es.len() as u64).to_le_bytes());
        buf[8..16].copy_from_slice(&level.to_le_bytes());
        for (i, e) in es.iter().enumerate() {
            let o = ENTRIES as usize + 32 * i;
            for (j, w) in [e.key, e.val, e.start, e.end].iter().enumerate() {
                buf[o + 8 * j..o + 8 * j + 8].copy_from_slice(&w.to_le_bytes());
            }
        }
        self.pool.space.write(n, &buf);
        self.pool.persist(n, buf.len() as u64, NODE_FLUSH, NODE_FENCE);
        n
    }

    /// Applies to `path[depth]`: end the entry pointing at `old_child` (if
    /// any) and add entries `add` (fresh starts); rewrites the node into new
    /// ones when they do not fit, propagating to the parent.
    fn rewrite(&self, st: &mut State, path: &[u64], depth: usize, old_child: Option<u64>, add: Vec<(u64, u64)>) {
        let n = path[depth];
        let v = st.v();
        let level = self.level(n);
        if self.count(n) + add.len() as u64 <= self.m {
            if let Some(oc) = old_child {
                let i = (0..self.count(n))
                    .find(|&i| {
                        let e = self.entry(n, i);
                        e.alive(v) && e.val == oc
                    })
                    .expect("the parent has an entry for its child");
                self.end_entry(n, i, v);
            }
            for (key, val) in add {
                let start = st.next_start();
                self.shift_insert(
                    n,
                    Entry {
                        key,
                        val,
                        start,
                        end: LIVE,
                    },
                );
            }
            return;
        }
        // Copy-on-write: the live entries and the new ones into new nodes.
        let mut es: Vec<Entry> = self
            .entries(n)
            .into_iter()
            .filter(|e| e.alive(v) && !(level > 0 && Some(e.val) == old_child))
            .collect();
        for (key, val) in add {
            let start = st.next_start();
            let e = Entry {
                key,
                val,
                start,
                end: LIVE,
            };
            let pos = es.partition_point(|x| x.key <= key);
            es.insert(pos, e);
        }
        let new: Vec<(u64, u64)> = if (es.len() as u64) <= self.m * 3 / 4 {
            vec![(es.first().map_or(0, |e| e.key), self.write_node(level, &es))]
        } else {
            let h = es.len() / 2;
            if level == 0 {
                st.splits += 1;
            }
            vec![
                (es[0].key, self.write_node(level, &es[..h])),
                (es[h].key, self.write_node(level, &es[h..])),
            ]
        };
        st.dead.push(n);
        if depth == 0 {
            let root = if new.len() == 1 {
                new[0].1
            } else {
                let s0 = st.next_start();
                let s1 = st.next_start();
                self.write_node(
                    level + 1,
                    &[
                        Entry {
                            key: 0,
                            val: new[0].1,
                            start: s0,
                            end: LIVE,
                        },
                        Entry {
                            key: new[1].0,
                            val: new[1].1,
                            start: s1,
                            end: LIVE,
                        },
                    ],
                )
            };
            let p = &self.pool;
            // The previous root before the version that names it: the two
            // words share a line, and a torn write-back must not pair a new
            // version with a stale previous root.
            p.store(PREV_ROOT, n);
            p.persist(PREV_ROOT, 8, ROOT_FLUSH, ROOT_FENCE);
            p.store(ROOT_CHANGED, v);
            p.persist(ROOT_CHANGED, 8, ROOT_FLUSH, ROOT_FENCE);
            p.store(ROOT_NODE, root);
            p.persist(ROOT_NODE, 8, ROOT_FLUSH, ROOT_FENCE);
            st.root = root;
        } else {
            // The parent's entry keeps its key for the first new node.
            let parent = path[depth - 1];
            let pkey = (0..self.count(parent))
                .map(|i| self.entry(parent, i))
                .find(|e| e.alive(v) && e.val == n)
                .expect("the parent has an entry for its child")
                .key;
            let mut add = new;
            add[0].0 = pkey;
            self.rewrite(st, path, depth - 1, Some(n), add);
        }
    }

    /// Commits the operation: the version store, then the replaced nodes are freed.
    fn commit(&self, st: &mut State) {
        st.gv += 1;
        st.seq = 0;
        self.pool.store(VERSION, st.gv);
        self.pool.persist(VERSION, 8, VERSION_FLUSH, VERSION_FENCE);
        for n in st.dead.drain(..) {
            self.pool.free(n);
        }
    }

    /// Slot of the visible entry for `key` in leaf `n`.
    fn find(&self, n: u64, key: u64, gv: u64) -> Option<(u64, Entry)> {
        let es = self.entries(n);
        let lb = es.partition_point(|e| e.key < key);
        es[lb..]
            .iter()
            .enumerate()
            .take_while(|(_, e)| e.key == key)
            .find(|(_, e)| e.visible(gv))
            .map(|(i, e)| ((lb + i) as u64, *e))
    }

    fn put(&self, st: &mut State, key: u64, val: u64, update_only: bool) -> bool {
        let path = self.path(st.root, key, st.gv);
        let leaf = *path.last().unwrap();
        let old = self.find(leaf, key, st.gv);
        if update_only && old.is_none() {
            return false;
        }
        if let Some((i, _)) = old {
            self.end_entry(leaf, i, st.v());
        }
        self.rewrite(st, &path, path.len() - 1, None, vec![(key, val)]);
        self.commit(st);
        old.is_some()
    }

    fn remove(&self, st: &mut State, key: u64) -> bool {
        let leaf = *self.path(st.root, key, st.gv).last().unwrap();
        let Some((i, _)) = self.find(leaf, key, st.gv) else {
            return false;
        };
        self.end_entry(leaf, i, st.v());
        self.commit(st);
        true
    }

    fn get(&self, st: &State, key: u64) -> Option<u64> {
        let leaf = *self.path(st.root, key, st.gv).last().unwrap();
        self.find(leaf, key, st.gv).map(|(_, e)| e.val)
    }

    fn scan_node(&self, n: u64, start: u64, gv: u64, want: usize, out: &mut Vec<(u64, u64)>) {
        let vis: Vec<Entry> = self.entries(n).into_iter().filter(|e| e.visible(gv)).collect();
        if self.level(n) == 0 {
            for e in vis.iter().filter(|e| e.key >= start) {
                if out.len() >= want {
                    return;
                }
                out.push((e.key, e.val));
            }
            return;
        }
        let first = vis.partition_point(|e| e.key <= start).saturating_sub(1);
        for e in &vis[first..] {
            if out.len() >= want {
                return;
            }
            self.scan_node(e.val, start, gv, want, out);
        }
    }

    fn scan_from(&self, st: &State, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let want = out.len().saturating_add(n);
        self.scan_node(st.root, start, st.gv, want, out);
    }
}

single_lock_bench_index!(Cdds, "cdds", "versioned");
