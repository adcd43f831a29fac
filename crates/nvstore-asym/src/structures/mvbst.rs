//! Multi-version binary search tree (AsymNVM §6.2 "Multi-version Data
//! Structure", §8.3): the nodes of [`super::bst`], but a published node is
//! never changed. An insert copies the path from the changed node up to the
//! root (path copying) and then swaps the root word in the metadata object
//! `{root, count}`: readers that read the root before the swap walk the old
//! version, readers after it the new one, both without a lock
//! ([`Remote::read_versioned`]).
//!
//! Nodes created since the front-end last sent a transaction are invisible
//! to readers ([`Remote::is_fresh`]), so a batch of operations copies each
//! node at most once and changes its copy in place afterwards (AsymNVM
//! §9.3, batching). The nodes a version replaces are retired and reused
//! only after the reclamation delay ([`Remote::retire`]). Like the paper's
//! evaluation (§9), the multi-version trees offer insert and find.

use std::collections::BTreeMap;

use super::bst::{cache_depth, walk, Node, NODE};
use super::{op_log, open_meta, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

const META: usize = 16;
const OP_PUT: u8 = 1;

/// A multi-version binary search tree on a back-end.
pub struct MvBst {
    meta: u64,
}

impl MvBst {
    /// Opens (or creates) the tree named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<MvBst> {
        Ok(MvBst {
            meta: open_meta(r, name, META)?,
        })
    }

    fn meta(&self, r: &mut Remote) -> Result<(u64, u64)> {
        let b = r.read(self.meta, META, 0)?;
        Ok((u64_at(&b, 0), u64_at(&b, 8)))
    }

    /// Items of the version `r` sees.
    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(self.meta(r)?.1)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// The value of `key` (a reader calls it inside [`Remote::read_versioned`]).
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let (mut at, _) = self.meta(r)?;
        let mut depth = 1;
        while at != 0 {
            let n = Node::parse(&r.read(at, NODE, cache_depth(depth))?);
            if n.key == key {
                return Ok(Some(n.value));
            }
            at = n.child(key).0;
            depth += 1;
        }
        Ok(None)
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let (root, mut count) = self.meta(r)?;
        let mut path: Vec<(u64, Node)> = Vec::new();
        let mut at = root;
        let mut found = false;
        while at != 0 {
            let n = Node::parse(&r.read(at, NODE, cache_depth(path.len() as u32 + 1))?);
            let next = n.child(key).0;
            found = n.key == key;
            path.push((at, n));
            if found {
                break;
            }
            at = next;
        }
        // The new version of the lowest changed node.
        let mut cur = if found {
            let (at, mut n) = path.pop().unwrap();
            n.value = value.to_vec();
            if r.is_fresh(at) {
                // Not yet visible to anyone: change it where it is.
                return r.write(at + 24, value);
            }
            let c = r.alloc(NODE as u64)?;
            r.write_new(c, &n.bytes(), cache_depth(path.len() as u32 + 1))?;
            r.retire(at, NODE as u64)?;
            c
        } else {
            count += 1;
            let c = r.alloc(NODE as u64)?;
            let n = Node {
                key,
                left: 0,
                right: 0,
                value: value.to_vec(),
            };
            r.write_new(c, &n.bytes(), cache_depth(path.len() as u32 + 1))?;
            c
        };
        // Copy the path up to the root, or up to a node not yet visible.
        let mut new_root = Some(cur);
        while let Some((at, mut n)) = path.pop() {
            let off = n.child(key).1;
            if r.is_fresh(at) {
                r.write(at + off, &cur.to_le_bytes())?;
                new_root = None;
                break;
            }
            if off == 8 {
                n.left = cur;
            } else {
                n.right = cur;
            }
            let c = r.alloc(NODE as u64)?;
            r.write_new(c, &n.bytes(), cache_depth(path.len() as u32 + 1))?;
            r.retire(at, NODE as u64)?;
            cur = c;
            new_root = Some(cur);
        }
        let root = new_root.unwrap_or(root);
        let mut m = root.to_le_bytes().to_vec();
        m.extend_from_slice(&count.to_le_bytes());
        r.write(self.meta, &m)
    }

    /// Every pair of the version `r` sees, in key order.
    pub fn items(&self, r: &mut Remote) -> Result<BTreeMap<u64, Vec<u8>>> {
        let (root, _) = self.meta(r)?;
        let mut out = BTreeMap::new();
        walk(r, root, 1, &mut out, &mut (0, u64::MAX))?;
        Ok(out)
    }
}

impl Replay for MvBst {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            _ => Err(Error::Protocol(format!("not an MV-BST operation: {op:?}"))),
        }
    }
}
