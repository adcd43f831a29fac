//! B+-tree of fan-out 32 (AsymNVM §8.3, §9.2): `u64` keys, 64-byte values
//! in the leaves, leaves chained. Nodes are read with their depth (0 =
//! root) so the level-aware cache keeps the upper levels; every write
//! operation is one operation log, and its node writes are memory logs.
//!
//! Node layout: word 0 = `leaf | count << 8`, word 1 = next leaf, then
//! 32 keys, then 32 values (leaf) or 33 children (inner).

use std::collections::BTreeMap;

use super::{op_log, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

/// Fan-out: keys per node.
pub const FANOUT: usize = 32;
const KEYS: usize = 16;
pub(crate) const PAYLOAD: usize = KEYS + FANOUT * 8;
pub(crate) const LEAF_SIZE: usize = PAYLOAD + FANOUT * VALUE;
pub(crate) const INNER_SIZE: usize = PAYLOAD + (FANOUT + 1) * 8;
const META: usize = 24;
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;

#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub leaf: bool,
    pub next: u64,
    pub keys: Vec<u64>,
    pub vals: Vec<Vec<u8>>,
    pub kids: Vec<u64>,
}

impl Node {
    pub(crate) fn size(&self) -> usize {
        if self.leaf {
            LEAF_SIZE
        } else {
            INNER_SIZE
        }
    }

    pub(crate) fn parse(b: &[u8]) -> Node {
        let w0 = u64_at(b, 0);
        let leaf = w0 & 1 == 1;
        // Bounded by the node's room, whatever the bytes say.
        let n = ((w0 >> 8) as usize).min(FANOUT);
        if !leaf && b.len() < INNER_SIZE || leaf && b.len() < LEAF_SIZE {
            return Node {
                leaf,
                next: 0,
                keys: vec![],
                vals: vec![],
                kids: vec![0],
            };
        }
        let keys = (0..n).map(|i| u64_at(b, KEYS + i * 8)).collect();
        let (vals, kids) = if leaf {
            (
                (0..n)
                    .map(|i| b[PAYLOAD + i * VALUE..PAYLOAD + (i + 1) * VALUE].to_vec())
                    .collect(),
                Vec::new(),
            )
        } else {
            (Vec::new(), (0..=n).map(|i| u64_at(b, PAYLOAD + i * 8)).collect())
        };
        Node {
            leaf,
            next: u64_at(b, 8),
            keys,
            vals,
            kids,
        }
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.size()];
        b[..8].copy_from_slice(&((self.leaf as u64) | (self.keys.len() as u64) << 8).to_le_bytes());
        b[8..16].copy_from_slice(&self.next.to_le_bytes());
        for (i, k) in self.keys.iter().enumerate() {
            b[KEYS + i * 8..KEYS + i * 8 + 8].copy_from_slice(&k.to_le_bytes());
        }
        if self.leaf {
            for (i, v) in self.vals.iter().enumerate() {
                b[PAYLOAD + i * VALUE..PAYLOAD + i * VALUE + v.len()].copy_from_slice(v);
            }
        } else {
            for (i, c) in self.kids.iter().enumerate() {
                b[PAYLOAD + i * 8..PAYLOAD + i * 8 + 8].copy_from_slice(&c.to_le_bytes());
            }
        }
        b
    }
}

/// A node's key count and leaf flag, read from its bytes (bounded by
/// the node's room, as [`Node::parse`] bounds them).
fn header(b: &[u8]) -> (bool, usize) {
    let w0 = u64_at(b, 0);
    (w0 & 1 == 1, ((w0 >> 8) as usize).min(FANOUT))
}

/// The number of a node's first `n` keys that are `<= key` (the child to
/// route to), found on the node's bytes without parsing it.
fn route_index(b: &[u8], n: usize, key: u64) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if u64_at(b, KEYS + mid * 8) <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Where `key` is among a leaf's first `n` keys: `Ok(slot)` or `Err(insertion point)`.
fn leaf_search(b: &[u8], n: usize, key: u64) -> std::result::Result<usize, usize> {
    let i = route_index(b, n, key);
    if i > 0 && u64_at(b, KEYS + (i - 1) * 8) == key {
        Ok(i - 1)
    } else {
        Err(i)
    }
}

/// A leaf's bytes `old` (with `n < FANOUT` keys) after inserting `key`
/// and `value` at slot `i`: the bytes [`Node::bytes`] gives for the parsed
/// leaf with the pair inserted, made by shifting the tail in a copy.
fn leaf_insert(old: &[u8], n: usize, i: usize, key: u64, value: &[u8]) -> Vec<u8> {
    let mut new = old[..LEAF_SIZE].to_vec();
    new.copy_within(KEYS + i * 8..KEYS + n * 8, KEYS + (i + 1) * 8);
    new.copy_within(PAYLOAD + i * VALUE..PAYLOAD + n * VALUE, PAYLOAD + (i + 1) * VALUE);
    new[KEYS + i * 8..KEYS + (i + 1) * 8].copy_from_slice(&key.to_le_bytes());
    new[PAYLOAD + i * VALUE..PAYLOAD + (i + 1) * VALUE].copy_from_slice(value);
    new[..8].copy_from_slice(&(1 | ((n as u64 + 1) << 8)).to_le_bytes());
    // Past the count a node is zeros, as `Node::bytes` writes it.
    new[KEYS + (n + 1) * 8..PAYLOAD].fill(0);
    new[PAYLOAD + (n + 1) * VALUE..].fill(0);
    new
}

/// The child an inner node's bytes route `key` to.
fn route(b: &[u8], key: u64) -> u64 {
    let (_, n) = header(b);
    if b.len() < INNER_SIZE {
        return 0;
    }
    u64_at(b, PAYLOAD + route_index(b, n, key) * 8)
}

/// A B+-tree on a back-end.
pub struct BpTree {
    meta: u64,
}

struct Meta {
    root: u64,
    height: u64,
    count: u64,
}

impl BpTree {
    /// Opens (or creates) the tree named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<BpTree> {
        if let Some(a) = r.name_get(name)? {
            return Ok(BpTree { meta: a });
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
        let t = BpTree { meta };
        t.put_meta(
            r,
            &Meta {
                root,
                height: 1,
                count: 0,
            },
            true,
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

    fn put_meta(&self, r: &mut Remote, m: &Meta, new: bool) -> Result<()> {
        let mut b = Vec::with_capacity(META);
        for w in [m.root, m.height, m.count] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        if new {
            r.write_new(self.meta, &b, 0)
        } else {
            r.write(self.meta, &b)
        }
    }

    fn read_node(r: &mut Remote, at: u64, depth: u64, height: u64) -> Result<Node> {
        Ok(Self::read_raw(r, at, depth, height)?.0)
    }

    /// A node and the bytes it was parsed from (what its rewrite is diffed against).
    fn read_raw(r: &mut Remote, at: u64, depth: u64, height: u64) -> Result<(Node, Vec<u8>)> {
        let size = if depth + 1 == height { LEAF_SIZE } else { INNER_SIZE };
        let b = r.read(at, size, depth as u32 + 1)?;
        Ok((Node::parse(&b), b))
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(self.get_meta(r)?.count)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// The value of `key`.
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let m = self.get_meta(r)?;
        let mut at = m.root;
        for depth in 0..m.height {
            let size = if depth + 1 == m.height { LEAF_SIZE } else { INNER_SIZE };
            // Routed and answered on the (cached) bytes, without parsing.
            let step = r.read_with(at, size, depth as u32 + 1, |b| {
                let (leaf, n) = header(b);
                if !leaf {
                    return Err(route(b, key));
                }
                Ok((b.len() >= LEAF_SIZE)
                    .then(|| leaf_search(b, n, key).ok())
                    .flatten()
                    .map(|i| b[PAYLOAD + i * VALUE..PAYLOAD + (i + 1) * VALUE].to_vec()))
            })?;
            match step {
                Ok(v) => return Ok(v),
                Err(next) => at = next,
            }
        }
        Err(Error::Protocol("B+-tree deeper than its height".into()))
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    /// Inserts or replaces `key` as part of an operation the caller began
    /// with its own operation log: a transaction that updates several keys
    /// logs once and re-executes as a whole (see `crate::apps`).
    pub fn put_in_op(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        self.do_put(r, key, &value64(value))
    }

    /// Removes `key`, returning its value; durable when it returns.
    pub fn remove(&mut self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        r.begin(&op_log(OP_DEL, key, &[]));
        let v = self.do_remove(r, key)?;
        r.commit()?;
        Ok(v)
    }

    /// [`BpTree::remove`] inside an operation the caller began.
    pub fn remove_in_op(&mut self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        self.do_remove(r, key)
    }

    /// Removes the key from its leaf in place. Leaves are not merged (lazy
    /// deletion): a leaf may become empty, searches and scans pass over it
    /// and later inserts refill it; separators stay valid bounds.
    fn do_remove(&mut self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let mut m = self.get_meta(r)?;
        let mut at = m.root;
        for depth in 0..m.height {
            let (mut n, old) = Self::read_raw(r, at, depth, m.height)?;
            if !n.leaf {
                at = n.kids[n.keys.partition_point(|k| *k <= key)];
                continue;
            }
            let Ok(i) = n.keys.binary_search(&key) else {
                return Ok(None);
            };
            n.keys.remove(i);
            let v = n.vals.remove(i);
            r.write_changes(at, &old, &n.bytes())?;
            m.count -= 1;
            self.put_meta(r, &m, false)?;
            return Ok(Some(v));
        }
        Err(Error::Protocol("B+-tree deeper than its height".into()))
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let mut m = self.get_meta(r)?;
        // Route on the nodes' bytes; nodes are parsed only if a split needs them.
        let mut raw = Vec::with_capacity(m.height as usize);
        let mut at = m.root;
        for depth in 0..m.height {
            let size = if depth + 1 == m.height { LEAF_SIZE } else { INNER_SIZE };
            let b = r.read(at, size, depth as u32 + 1)?;
            let (leaf, _) = header(&b);
            let next = if leaf { 0 } else { route(&b, key) };
            raw.push((at, b));
            at = next;
        }
        let (leaf_at, old) = raw.last().unwrap();
        let (is_leaf, n) = header(old);
        if is_leaf && old.len() >= LEAF_SIZE {
            match leaf_search(old, n, key) {
                Ok(i) => {
                    let off = PAYLOAD + i * VALUE;
                    return r.write(leaf_at + off as u64, value);
                }
                Err(i) if n < FANOUT => {
                    // Room in the leaf: shift the keys and values past the
                    // insertion point in a copy and write what changed.
                    let new = leaf_insert(old, n, i, key, value);
                    r.write_changes(*leaf_at, old, &new)?;
                    m.count += 1;
                    return self.put_meta(r, &m, false);
                }
                Err(_) => {}
            }
        }
        let mut path: Vec<(u64, Node, Vec<u8>)> = raw.into_iter().map(|(a, b)| (a, Node::parse(&b), b)).collect();
        let (leaf_at, mut leaf, mut old) = path.pop().unwrap();
        match leaf.keys.binary_search(&key) {
            Ok(i) => {
                leaf.vals[i] = value.to_vec();
                let off = PAYLOAD + i * VALUE;
                return r.write(leaf_at + off as u64, value);
            }
            Err(i) => {
                leaf.keys.insert(i, key);
                leaf.vals.insert(i, value.to_vec());
            }
        }
        m.count += 1;
        let mut node_at = leaf_at;
        let mut node = leaf;
        loop {
            if node.keys.len() <= FANOUT {
                r.write_changes(node_at, &old, &node.bytes())?;
                break;
            }
            // Split: the right half moves to a new node.
            let mid = node.keys.len() / 2;
            let right_at = r.alloc(node.size() as u64)?;
            let (sep, right) = if node.leaf {
                let right = Node {
                    leaf: true,
                    next: node.next,
                    keys: node.keys.split_off(mid),
                    vals: node.vals.split_off(mid),
                    kids: vec![],
                };
                node.next = right_at;
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
            let depth = path.len() as u32 + 1;
            r.write_new(right_at, &right.bytes(), depth)?;
            r.write_changes(node_at, &old, &node.bytes())?;
            match path.pop() {
                Some((pa, mut p, pold)) => {
                    let i = p.keys.partition_point(|k| *k <= sep);
                    p.keys.insert(i, sep);
                    p.kids.insert(i + 1, right_at);
                    node_at = pa;
                    node = p;
                    old = pold;
                }
                None => {
                    let root_at = r.alloc(INNER_SIZE as u64)?;
                    let root = Node {
                        leaf: false,
                        next: 0,
                        keys: vec![sep],
                        vals: vec![],
                        kids: vec![node_at, right_at],
                    };
                    r.write_new(root_at, &root.bytes(), 1)?;
                    m.root = root_at;
                    m.height += 1;
                    break;
                }
            }
        }
        self.put_meta(r, &m, false)
    }

    /// Every pair in key order, along the leaf chain.
    pub fn scan(&self, r: &mut Remote) -> Result<BTreeMap<u64, Vec<u8>>> {
        let m = self.get_meta(r)?;
        let mut at = m.root;
        for depth in 0..m.height - 1 {
            at = Self::read_node(r, at, depth, m.height)?.kids[0];
        }
        let mut out = BTreeMap::new();
        while at != 0 {
            let n = Node::parse(&r.read(at, LEAF_SIZE, m.height as u32)?);
            for (k, v) in n.keys.iter().zip(n.vals) {
                out.insert(*k, v);
            }
            at = n.next;
        }
        Ok(out)
    }
}

impl Replay for BpTree {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEL) if op.len() == 9 => self.do_remove(r, u64_at(op, 1)).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a B+-tree operation: {op:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_insert_on_the_bytes_equals_the_parsed_leaf_rewritten() {
        let mut leaf = Node {
            leaf: true,
            next: 0x1234,
            keys: vec![],
            vals: vec![],
            kids: vec![],
        };
        let mut bytes = leaf.bytes();
        // Inserts at the front, the back and between, up to a full leaf.
        for (j, key) in (0..FANOUT as u64).map(|j| (j, (j * 7919) % 101)).collect::<Vec<_>>() {
            let value = [j as u8 + 1; VALUE];
            let (is_leaf, n) = header(&bytes);
            assert!(is_leaf);
            let i = leaf_search(&bytes, n, key).unwrap_err();
            assert_eq!(i, leaf.keys.partition_point(|k| *k < key));
            let got = leaf_insert(&bytes, n, i, key, &value);
            leaf.keys.insert(i, key);
            leaf.vals.insert(i, value.to_vec());
            assert_eq!(got, leaf.bytes(), "insert of {key} at {i}");
            bytes = got;
            assert_eq!(leaf_search(&bytes, n + 1, key), Ok(i));
        }
        let inner = Node {
            leaf: false,
            next: 0,
            keys: vec![10, 20, 30],
            vals: vec![],
            kids: vec![1, 2, 3, 4],
        };
        let b = inner.bytes();
        for (key, kid) in [(0, 1), (10, 2), (19, 2), (20, 3), (30, 4), (99, 4)] {
            assert_eq!(route(&b, key), kid, "{key}");
        }
    }
}
