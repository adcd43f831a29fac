//! Binary search tree (AsymNVM §8.3, §9.2): `u64` keys, 64-byte values,
//! unbalanced. A node is `{key, left, right, value[64]}` (88 bytes); the
//! metadata object is `{root, count}`. Nodes are read with their depth
//! (the root is depth 1, the metadata 0; four tree levels per cache level),
//! so the level-aware cache keeps the upper levels. Every write operation is one operation log and its
//! writes are memory logs; removing a node with two children moves its
//! in-order successor's key and value into it and unlinks the successor.

use std::collections::BTreeMap;

use super::{op_log, open_meta, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

/// Bytes of a node.
pub const NODE: usize = 24 + VALUE;
const META: usize = 16;
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
/// Offsets of a node's fields.
const LEFT: u64 = 8;
const RIGHT: u64 = 16;
const VAL: u64 = 24;

/// A node as read.
#[derive(Clone)]
pub(crate) struct Node {
    pub key: u64,
    pub left: u64,
    pub right: u64,
    pub value: Vec<u8>,
}

impl Node {
    pub(crate) fn parse(b: &[u8]) -> Node {
        Node {
            key: u64_at(b, 0),
            left: u64_at(b, 8),
            right: u64_at(b, 16),
            value: b[VAL as usize..NODE].to_vec(),
        }
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(NODE);
        for w in [self.key, self.left, self.right] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&self.value);
        b
    }

    /// The child a search for `key` follows, and the offset of its pointer.
    pub(crate) fn child(&self, key: u64) -> (u64, u64) {
        if key < self.key {
            (self.left, LEFT)
        } else {
            (self.right, RIGHT)
        }
    }
}

/// The cache level of a node at tree depth `depth` (root 1): a binary
/// tree is about four times as deep as a B+-tree of fan-out 32, so four
/// BST levels share one cache level and the level-aware cache can hold a
/// BST of the same size as deep.
pub(crate) fn cache_depth(depth: u32) -> u32 {
    1 + depth.saturating_sub(1) / 4
}

/// A binary search tree on a back-end.
pub struct Bst {
    meta: u64,
}

/// Where a search for a key ended: the word that points at the node (or
/// would point at a new one), the node's address (0 if absent), its bytes,
/// and its depth.
struct Found {
    link: u64,
    at: u64,
    node: Option<Node>,
    depth: u32,
}

impl Bst {
    /// Opens (or creates) the tree named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<Bst> {
        Ok(Bst {
            meta: open_meta(r, name, META)?,
        })
    }

    fn meta(&self, r: &mut Remote) -> Result<(u64, u64)> {
        let b = r.read(self.meta, META, 0)?;
        Ok((u64_at(&b, 0), u64_at(&b, 8)))
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(self.meta(r)?.1)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    fn read_node(r: &mut Remote, at: u64, depth: u32) -> Result<Node> {
        Ok(Node::parse(&r.read(at, NODE, cache_depth(depth))?))
    }

    /// Walks from `root` (pointed at by `link`) towards `key`.
    fn find(r: &mut Remote, mut link: u64, root: u64, key: u64) -> Result<Found> {
        let mut at = root;
        let mut depth = 1u32;
        while at != 0 {
            let n = Self::read_node(r, at, depth)?;
            if n.key == key {
                return Ok(Found {
                    link,
                    at,
                    node: Some(n),
                    depth,
                });
            }
            let (next, off) = n.child(key);
            link = at + off;
            at = next;
            depth += 1;
        }
        Ok(Found {
            link,
            at: 0,
            node: None,
            depth,
        })
    }

    /// The value of `key`.
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let (root, _) = self.meta(r)?;
        Ok(Self::find(r, self.meta, root, key)?.node.map(|n| n.value))
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let (root, count) = self.meta(r)?;
        let f = Self::find(r, self.meta, root, key)?;
        if f.node.is_some() {
            return r.write(f.at + VAL, value);
        }
        let at = r.alloc(NODE as u64)?;
        let n = Node {
            key,
            left: 0,
            right: 0,
            value: value.to_vec(),
        };
        r.write_new(at, &n.bytes(), cache_depth(f.depth))?;
        r.write(f.link, &at.to_le_bytes())?;
        r.write(self.meta + 8, &(count + 1).to_le_bytes())
    }

    /// Removes `key`, returning its value; durable when it returns.
    pub fn remove(&mut self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        r.begin(&op_log(OP_DEL, key, &[]));
        let v = self.do_remove(r, key)?;
        r.commit()?;
        Ok(v)
    }

    fn do_remove(&mut self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let (root, count) = self.meta(r)?;
        let f = Self::find(r, self.meta, root, key)?;
        let Some(n) = f.node else {
            return Ok(None);
        };
        if n.left == 0 || n.right == 0 {
            // At most one child: it takes the node's place.
            let child = if n.left == 0 { n.right } else { n.left };
            r.write(f.link, &child.to_le_bytes())?;
            r.free(f.at, NODE as u64)?;
        } else {
            // Two children: the leftmost node of the right subtree moves up.
            let (mut link, mut at, mut depth) = (f.at + RIGHT, n.right, f.depth + 1);
            let mut s = Self::read_node(r, at, depth)?;
            while s.left != 0 {
                link = at + LEFT;
                at = s.left;
                depth += 1;
                s = Self::read_node(r, at, depth)?;
            }
            r.write(f.at, &s.key.to_le_bytes())?;
            r.write(f.at + VAL, &s.value)?;
            r.write(link, &s.right.to_le_bytes())?;
            r.free(at, NODE as u64)?;
        }
        r.write(self.meta + 8, &(count - 1).to_le_bytes())?;
        Ok(Some(n.value))
    }

    /// Every pair in key order (an in-order walk).
    pub fn items(&self, r: &mut Remote) -> Result<BTreeMap<u64, Vec<u8>>> {
        let (root, _) = self.meta(r)?;
        let mut out = BTreeMap::new();
        walk(r, root, 1, &mut out, &mut (0, u64::MAX))?;
        Ok(out)
    }
}

/// In-order walk of the subtree at `at`; fails if a key is outside the
/// bounds its ancestors allow (or repeats), so a damaged tree is noticed.
pub(crate) fn walk(
    r: &mut Remote,
    at: u64,
    depth: u32,
    out: &mut BTreeMap<u64, Vec<u8>>,
    bounds: &mut (u64, u64),
) -> Result<()> {
    if at == 0 {
        return Ok(());
    }
    let n = Node::parse(&r.read(at, NODE, cache_depth(depth))?);
    let (lo, hi) = *bounds;
    if n.key < lo || n.key > hi || out.contains_key(&n.key) {
        return Err(Error::Protocol(format!(
            "BST key {} outside [{lo}, {hi}] or repeated",
            n.key
        )));
    }
    if n.key > 0 {
        walk(r, n.left, depth + 1, out, &mut (lo, n.key - 1))?;
    } else if n.left != 0 {
        return Err(Error::Protocol("BST key 0 has a left child".into()));
    }
    out.insert(n.key, n.value.clone());
    if n.key < u64::MAX {
        walk(r, n.right, depth + 1, out, &mut (n.key + 1, hi))?;
    } else if n.right != 0 {
        return Err(Error::Protocol("BST key u64::MAX has a right child".into()));
    }
    Ok(())
}

impl Replay for Bst {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEL) if op.len() == 9 => self.do_remove(r, u64_at(op, 1)).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a BST operation: {op:?}"))),
        }
    }
}
