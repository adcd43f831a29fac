//! Multi-version B+-tree (AsymNVM §6.2 "Multi-version Data Structure",
//! §8.3): the nodes of [`super::bptree`] (fan-out 32), but a published node
//! is never changed. An insert copies the leaf it changes (two nodes when it
//! splits) and every node above it up to the root (path copying), then
//! swaps the root word of the metadata object `{root, height, count}`:
//! readers walk whichever version's root they read, without a lock
//! ([`Remote::read_versioned`]). Leaves are not chained (a chain would make
//! every insert copy the whole tree to the left); [`MvBpTree::scan`] walks
//! the tree.
//!
//! Nodes created since the front-end last sent a transaction are invisible
//! to readers ([`Remote::is_fresh`]) and are changed in place, so within a
//! batch each node is copied at most once. Replaced nodes are retired
//! ([`Remote::retire`]). Like the paper's evaluation (§9), the
//! multi-version trees offer insert and find.

use std::collections::BTreeMap;

use super::bptree::{Node, FANOUT, INNER_SIZE, LEAF_SIZE};
use super::{op_log, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

const META: usize = 24;
const OP_PUT: u8 = 1;

/// A multi-version B+-tree on a back-end.
pub struct MvBpTree {
    meta: u64,
}

struct Meta {
    root: u64,
    height: u64,
    count: u64,
}

impl MvBpTree {
    /// Opens (or creates) the tree named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<MvBpTree> {
        if let Some(meta) = r.name_get(name)? {
            return Ok(MvBpTree { meta });
        }
        let root = r.alloc(LEAF_SIZE as u64)?;
        let leaf = Node {
            leaf: true,
            next: 0,
            keys: vec![],
            vals: vec![],
            kids: vec![],
        };
        r.write_new(root, &leaf.bytes(), 1)?;
        let meta = r.alloc(META as u64)?;
        let t = MvBpTree { meta };
        t.put_meta(
            r,
            &Meta {
                root,
                height: 1,
                count: 0,
            },
        )?;
        r.flush()?;
        r.name_set(name, meta)?;
        Ok(t)
    }

    fn get_meta(&self, r: &mut Remote) -> Result<Meta> {
        let b = r.read(self.meta, META, 0)?;
        Ok(Meta {
            root: u64_at(&b, 0),
            height: u64_at(&b, 8),
            count: u64_at(&b, 16),
        })
    }

    fn put_meta(&self, r: &mut Remote, m: &Meta) -> Result<()> {
        let mut b = Vec::with_capacity(META);
        for w in [m.root, m.height, m.count] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        r.write(self.meta, &b)
    }

    fn read_node(r: &mut Remote, at: u64, depth: u64, height: u64) -> Result<Node> {
        let size = if depth + 1 == height { LEAF_SIZE } else { INNER_SIZE };
        Ok(Node::parse(&r.read(at, size, depth as u32 + 1)?))
    }

    /// Items of the version `r` sees.
    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(self.get_meta(r)?.count)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// The value of `key` (a reader calls it inside [`Remote::read_versioned`]).
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let m = self.get_meta(r)?;
        let mut at = m.root;
        for depth in 0..m.height.min(64) {
            let n = Self::read_node(r, at, depth, m.height)?;
            if n.leaf {
                return Ok(n.keys.binary_search(&key).ok().map(|i| n.vals[i].clone()));
            }
            at = n.kids[n.keys.partition_point(|k| *k <= key).min(n.kids.len() - 1)];
        }
        Err(Error::Protocol("MV B+-tree deeper than its height".into()))
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    /// Writes `node`, which replaces the node at `old` (0: none), at `old`
    /// itself if no reader can see it yet, else at a new block (retiring
    /// `old`); answers where it went.
    fn place(r: &mut Remote, old: u64, node: &Node, depth: u32) -> Result<u64> {
        if old != 0 && r.is_fresh(old) {
            r.write(old, &node.bytes())?;
            return Ok(old);
        }
        let at = r.alloc(node.size() as u64)?;
        r.write_new(at, &node.bytes(), depth)?;
        if old != 0 {
            r.retire(old, node.size() as u64)?;
        }
        Ok(at)
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let mut m = self.get_meta(r)?;
        let mut path = Vec::new();
        let mut at = m.root;
        for depth in 0..m.height {
            let n = Self::read_node(r, at, depth, m.height)?;
            let next = if n.leaf {
                0
            } else {
                n.kids[n.keys.partition_point(|k| *k <= key)]
            };
            path.push((at, n));
            at = next;
        }
        let (mut node_at, mut node) = path.pop().unwrap();
        match node.keys.binary_search(&key) {
            Ok(i) => node.vals[i] = value.to_vec(),
            Err(i) => {
                node.keys.insert(i, key);
                node.vals.insert(i, value.to_vec());
                m.count += 1;
            }
        }
        loop {
            let depth = path.len() as u32 + 1;
            // The node's new version, and the right half if it split.
            let split = if node.keys.len() > FANOUT {
                let mid = node.keys.len() / 2;
                let (sep, right) = if node.leaf {
                    let right = Node {
                        leaf: true,
                        next: 0,
                        keys: node.keys.split_off(mid),
                        vals: node.vals.split_off(mid),
                        kids: vec![],
                    };
                    (right.keys[0], right)
                } else {
                    let rkeys = node.keys.split_off(mid + 1);
                    let sep = node.keys.pop().unwrap();
                    let right = Node {
                        leaf: false,
                        next: 0,
                        keys: rkeys,
                        vals: vec![],
                        kids: node.kids.split_off(mid + 1),
                    };
                    (sep, right)
                };
                let right_at = r.alloc(right.size() as u64)?;
                r.write_new(right_at, &right.bytes(), depth)?;
                Some((sep, right_at))
            } else {
                None
            };
            let was_fresh = r.is_fresh(node_at);
            let new_at = Self::place(r, node_at, &node, depth)?;
            match (path.pop(), split) {
                // Changed in place, no split: the parent already points here.
                (Some(_), None) if was_fresh => break,
                (Some((pa, mut p)), split) => {
                    let i = p.keys.partition_point(|k| *k <= key);
                    p.kids[i] = new_at;
                    if let Some((sep, right_at)) = split {
                        p.keys.insert(i, sep);
                        p.kids.insert(i + 1, right_at);
                    }
                    node_at = pa;
                    node = p;
                }
                (None, None) => {
                    m.root = new_at;
                    break;
                }
                (None, Some((sep, right_at))) => {
                    let root = Node {
                        leaf: false,
                        next: 0,
                        keys: vec![sep],
                        vals: vec![],
                        kids: vec![new_at, right_at],
                    };
                    m.root = r.alloc(INNER_SIZE as u64)?;
                    r.write_new(m.root, &root.bytes(), 1)?;
                    m.height += 1;
                    break;
                }
            }
        }
        self.put_meta(r, &m)
    }

    /// Every pair of the version `r` sees, in key order (a depth-first walk).
    pub fn scan(&self, r: &mut Remote) -> Result<BTreeMap<u64, Vec<u8>>> {
        let m = self.get_meta(r)?;
        let mut out = BTreeMap::new();
        self.scan_at(r, m.root, 0, m.height, &mut out)?;
        Ok(out)
    }

    fn scan_at(
        &self,
        r: &mut Remote,
        at: u64,
        depth: u64,
        height: u64,
        out: &mut BTreeMap<u64, Vec<u8>>,
    ) -> Result<()> {
        if depth >= height.min(64) {
            return Err(Error::Protocol("MV B+-tree deeper than its height".into()));
        }
        let n = Self::read_node(r, at, depth, height)?;
        if n.leaf {
            for (k, v) in n.keys.iter().zip(n.vals) {
                if out.last_key_value().is_some_and(|(l, _)| l >= k) {
                    return Err(Error::Protocol(format!("MV B+-tree key {k} out of order")));
                }
                out.insert(*k, v);
            }
            return Ok(());
        }
        for kid in n.kids {
            self.scan_at(r, kid, depth + 1, height, out)?;
        }
        Ok(())
    }
}

impl Replay for MvBpTree {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            _ => Err(Error::Protocol(format!("not an MV B+-tree operation: {op:?}"))),
        }
    }
}
