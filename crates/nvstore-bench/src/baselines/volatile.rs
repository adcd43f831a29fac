//! The volatile upper bound: a plain B+-tree in DRAM, no flushes, no fences
//! (the "volatile B+-tree" every persistent-tree paper compares against, e.g.
//! NV-Tree §6, FPTree §6, FAST-FAIR §5).
//!
//! Node layout (DRAM, not in the pool; `node_size` bytes of 16-byte entries):
//!
//! ```text
//! leaf:  keys: [u64; cap] sorted | values: [u64; cap] | next: leaf id
//! inner: keys: [u64; cap] sorted | children: [node id; cap + 1]
//!        child i covers keys in [keys[i-1], keys[i])
//! ```
//!
//! `cap = node_size / 16`. Deletes remove the entry from its leaf and never
//! merge or rebalance (empty leaves stay linked), as most persistent-tree
//! prototypes do; a workload of deletes only shrinks leaves.
//!
//! [`DramBTree`] is generic over the value so FPTree reuses it for its DRAM
//! inner nodes (separator key -> leaf offset, looked up with [`DramBTree::floor`]).

use parking_lot::Mutex;

use crate::engine::{BenchIndex, EngineStats};

const NONE: u32 = u32::MAX;

enum Node<V> {
    Leaf { keys: Vec<u64>, vals: Vec<V>, next: u32 },
    Inner { keys: Vec<u64>, kids: Vec<u32> },
}

/// A DRAM B+-tree from u64 keys to `V`.
pub struct DramBTree<V: Copy> {
    nodes: Vec<Node<V>>,
    root: u32,
    leaf_cap: usize,
    inner_cap: usize,
    len: u64,
    /// Leaf splits so far.
    pub splits: u64,
}

impl<V: Copy> DramBTree<V> {
    /// A tree whose nodes hold `node_size / 16` entries (at least 4).
    pub fn new(node_size: u64) -> DramBTree<V> {
        let cap = ((node_size / 16) as usize).max(4);
        DramBTree {
            nodes: vec![Node::Leaf {
                keys: Vec::with_capacity(cap + 1),
                vals: Vec::with_capacity(cap + 1),
                next: NONE,
            }],
            root: 0,
            leaf_cap: cap,
            inner_cap: cap,
            len: 0,
            splits: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The leaf that covers `key`, with the path of (inner node, child index).
    fn descend(&self, key: u64, path: Option<&mut Vec<(u32, usize)>>) -> u32 {
        let mut n = self.root;
        let mut path = path;
        loop {
            match &self.nodes[n as usize] {
                Node::Leaf { .. } => return n,
                Node::Inner { keys, kids } => {
                    let i = keys.partition_point(|&k| k <= key);
                    if let Some(p) = path.as_deref_mut() {
                        p.push((n, i));
                    }
                    n = kids[i];
                }
            }
        }
    }

    pub fn get(&self, key: u64) -> Option<V> {
        let l = self.descend(key, None);
        let Node::Leaf { keys, vals, .. } = &self.nodes[l as usize] else {
            unreachable!()
        };
        keys.binary_search(&key).ok().map(|i| vals[i])
    }

    /// Replaces the value of a present key.
    pub fn update(&mut self, key: u64, v: V) -> Option<V> {
        let l = self.descend(key, None);
        let Node::Leaf { keys, vals, .. } = &mut self.nodes[l as usize] else {
            unreachable!()
        };
        let i = keys.binary_search(&key).ok()?;
        Some(std::mem::replace(&mut vals[i], v))
    }

    /// Inserts or overwrites; returns the old value.
    pub fn insert(&mut self, key: u64, v: V) -> Option<V> {
        let mut path = Vec::with_capacity(8);
        let l = self.descend(key, Some(&mut path));
        let cap = self.leaf_cap;
        let new_id = self.nodes.len() as u32;
        let split = {
            let Node::Leaf { keys, vals, next } = &mut self.nodes[l as usize] else {
                unreachable!()
            };
            match keys.binary_search(&key) {
                Ok(i) => return Some(std::mem::replace(&mut vals[i], v)),
                Err(i) => {
                    keys.insert(i, key);
                    vals.insert(i, v);
                }
            }
            self.len += 1;
            if keys.len() <= cap {
                return None;
            }
            let h = keys.len() / 2;
            let mut rk = Vec::with_capacity(cap + 1);
            let mut rv = Vec::with_capacity(cap + 1);
            rk.extend_from_slice(&keys[h..]);
            rv.extend_from_slice(&vals[h..]);
            keys.truncate(h);
            vals.truncate(h);
            let sep = rk[0];
            let old_next = *next;
            *next = new_id;
            (
                sep,
                Node::Leaf {
                    keys: rk,
                    vals: rv,
                    next: old_next,
                },
            )
        };
        self.splits += 1;
        let (mut sep, right) = split;
        let mut right_id = new_id;
        self.nodes.push(right);
        // Propagate up the path.
        while let Some((p, i)) = path.pop() {
            let icap = self.inner_cap;
            let Node::Inner { keys, kids } = &mut self.nodes[p as usize] else {
                unreachable!()
            };
            keys.insert(i, sep);
            kids.insert(i + 1, right_id);
            if keys.len() <= icap {
                return None;
            }
            let mid = keys.len() / 2;
            let up = keys[mid];
            let mut rk = Vec::with_capacity(icap + 1);
            let mut rc = Vec::with_capacity(icap + 2);
            rk.extend_from_slice(&keys[mid + 1..]);
            rc.extend_from_slice(&kids[mid + 1..]);
            keys.truncate(mid);
            kids.truncate(mid + 1);
            sep = up;
            right_id = self.nodes.len() as u32;
            self.nodes.push(Node::Inner { keys: rk, kids: rc });
        }
        // The root split.
        let mut keys = Vec::with_capacity(self.inner_cap + 1);
        let mut kids = Vec::with_capacity(self.inner_cap + 2);
        keys.push(sep);
        kids.push(self.root);
        kids.push(right_id);
        self.root = self.nodes.len() as u32;
        self.nodes.push(Node::Inner { keys, kids });
        None
    }

    /// Removes a key (no rebalancing).
    pub fn remove(&mut self, key: u64) -> Option<V> {
        let l = self.descend(key, None);
        let Node::Leaf { keys, vals, .. } = &mut self.nodes[l as usize] else {
            unreachable!()
        };
        let i = keys.binary_search(&key).ok()?;
        keys.remove(i);
        self.len -= 1;
        Some(vals.remove(i))
    }

    /// The pair with the largest key <= `key`.
    pub fn floor(&self, key: u64) -> Option<(u64, V)> {
        self.floor_in(self.root, key)
    }

    fn floor_in(&self, n: u32, key: u64) -> Option<(u64, V)> {
        match &self.nodes[n as usize] {
            Node::Leaf { keys, vals, .. } => {
                let i = keys.partition_point(|&k| k <= key);
                (i > 0).then(|| (keys[i - 1], vals[i - 1]))
            }
            Node::Inner { keys, kids } => {
                let i = keys.partition_point(|&k| k <= key);
                // Empty leaves (deletes never merge) send us left.
                (0..=i).rev().find_map(|j| self.floor_in(kids[j], key))
            }
        }
    }

    /// Calls `f` on pairs with key >= `start` in key order until it returns false.
    pub fn scan_from(&self, start: u64, mut f: impl FnMut(u64, V) -> bool) {
        let mut l = self.descend(start, None);
        let mut first = true;
        while l != NONE {
            let Node::Leaf { keys, vals, next } = &self.nodes[l as usize] else {
                unreachable!()
            };
            let from = if first { keys.partition_point(|&k| k < start) } else { 0 };
            first = false;
            for i in from..keys.len() {
                if !f(keys[i], vals[i]) {
                    return;
                }
            }
            l = *next;
        }
    }
}

/// The `volatile` engine: a [`DramBTree`] behind a lock.
pub struct Volatile {
    tree: Mutex<DramBTree<u64>>,
}

impl Volatile {
    pub fn new(node_size: u64) -> Volatile {
        Volatile {
            tree: Mutex::new(DramBTree::new(node_size)),
        }
    }
}

impl BenchIndex for Volatile {
    fn name(&self) -> &'static str {
        "volatile"
    }
    fn insert(&self, key: u64, value: u64) {
        self.tree.lock().insert(key, value);
    }
    fn update(&self, key: u64, value: u64) -> bool {
        self.tree.lock().update(key, value).is_some()
    }
    fn delete(&self, key: u64) -> bool {
        self.tree.lock().remove(key).is_some()
    }
    fn search(&self, key: u64) -> Option<u64> {
        self.tree.lock().get(key)
    }
    fn scan(&self, start: u64, n: usize, out: &mut Vec<(u64, u64)>) {
        let t = self.tree.lock();
        let mut left = n;
        if left == 0 {
            return;
        }
        t.scan_from(start, |k, v| {
            out.push((k, v));
            left -= 1;
            left > 0
        });
    }
    fn stats(&self) -> EngineStats {
        EngineStats {
            splits: self.tree.lock().splits,
            ..EngineStats::default()
        }
    }
    fn leaf(&self) -> &'static str {
        "dram"
    }
}
