//! Skiplist (AsymNVM §8.2, §9.2): `u64` keys, 64-byte values, at most
//! [`MAX_HEIGHT`] levels. A node is `{key, height, value[64], next[height]}`;
//! the head is a node of full height whose key is never compared. A node's
//! height is a hash of its key (probability 1/4 per extra level), so
//! re-executing an operation log builds exactly the same node. Taller
//! nodes are read at shallower depths, so the level-aware cache keeps the
//! upper levels (AsymNVM §5).

use std::collections::HashMap;

use super::{op_log, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

/// Levels of the head node.
pub const MAX_HEIGHT: usize = 12;
const HDR: usize = 16 + VALUE;
const META: usize = 16;
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;

fn node_size(height: usize) -> usize {
    HDR + 8 * height
}

/// The height of `key`'s node.
pub fn height_of(key: u64) -> usize {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (1 + z.trailing_zeros() as usize / 2).min(MAX_HEIGHT)
}

#[derive(Clone)]
struct Node {
    key: u64,
    value: Vec<u8>,
    next: Vec<u64>,
}

impl Node {
    fn parse(b: &[u8]) -> Node {
        let h = (u64_at(b, 8) as usize).min(MAX_HEIGHT);
        Node {
            key: u64_at(b, 0),
            value: b[16..HDR].to_vec(),
            next: (0..h).map(|l| u64_at(b, HDR + 8 * l)).collect(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(node_size(self.next.len()));
        b.extend_from_slice(&self.key.to_le_bytes());
        b.extend_from_slice(&(self.next.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.value);
        for n in &self.next {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b
    }
}

/// A skiplist on a back-end.
pub struct SkipList {
    meta: u64,
    head: u64,
}

/// Where a search for a key ended: the predecessor at each level, and the
/// level-0 successor (the key's node when present).
struct Path {
    preds: Vec<(u64, Node)>,
    succ: Option<(u64, Node)>,
}

impl SkipList {
    /// Opens (or creates) the skiplist named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<SkipList> {
        if let Some(meta) = r.name_get(name)? {
            let head = u64_at(&r.read(meta, META, 0)?, 0);
            return Ok(SkipList { meta, head });
        }
        let head = r.alloc(node_size(MAX_HEIGHT) as u64)?;
        let h = Node {
            key: 0,
            value: vec![0; VALUE],
            next: vec![0; MAX_HEIGHT],
        };
        r.write_new(head, &h.bytes(), 0)?;
        let meta = r.alloc(META as u64)?;
        let mut m = head.to_le_bytes().to_vec();
        m.extend_from_slice(&0u64.to_le_bytes());
        r.write_new(meta, &m, 0)?;
        r.flush()?;
        r.name_set(name, meta)?;
        Ok(SkipList { meta, head })
    }

    fn count(&self, r: &mut Remote) -> Result<u64> {
        Ok(u64_at(&r.read(self.meta, META, 0)?, 8))
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        self.count(r)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    fn read_node(r: &mut Remote, at: u64, height: usize) -> Result<Node> {
        let d = if height == MAX_HEIGHT { 0 } else { depth(height) };
        let b = r.read(at, node_size(height), d)?;
        Ok(Node::parse(&b))
    }

    /// Searches for `key`, reading each node once.
    fn search(&self, r: &mut Remote, key: u64) -> Result<Path> {
        let mut seen: HashMap<u64, Node> = HashMap::new();
        let mut at = self.head;
        let mut node = Self::read_node(r, at, MAX_HEIGHT)?;
        let mut preds = vec![(0, node.clone()); MAX_HEIGHT];
        let mut succ = None;
        for l in (0..MAX_HEIGHT).rev() {
            loop {
                let nxt = node.next[l];
                if nxt == 0 {
                    break;
                }
                let (na, nh) = untag(nxt);
                let n = match seen.get(&na) {
                    Some(n) => n.clone(),
                    None => {
                        let n = Self::read_node(r, na, nh)?;
                        seen.insert(na, n.clone());
                        n
                    }
                };
                if n.key < key {
                    at = na;
                    node = n;
                } else {
                    if l == 0 {
                        succ = Some((na, n));
                    }
                    break;
                }
            }
            preds[l] = (at, node.clone());
        }
        Ok(Path { preds, succ })
    }

    /// The value of `key`.
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self
            .search(r, key)?
            .succ
            .filter(|(_, n)| n.key == key)
            .map(|(_, n)| n.value))
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let count = self.count(r)?;
        let p = self.search(r, key)?;
        if let Some((at, n)) = &p.succ {
            if n.key == key {
                return r.write(at + 16, value);
            }
        }
        let h = height_of(key);
        let at = r.alloc(node_size(h) as u64)?;
        if at & 15 != 0 {
            return Err(Error::Protocol(format!("skiplist node at unaligned {at:#x}")));
        }
        let node = Node {
            key,
            value: value.to_vec(),
            next: (0..h).map(|l| p.preds[l].1.next[l]).collect(),
        };
        r.write_new(at, &node.bytes(), depth(h))?;
        for (l, (pa, _)) in p.preds.iter().enumerate().take(h) {
            r.write(pa + (HDR + 8 * l) as u64, &tag(at, h).to_le_bytes())?;
        }
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
        let count = self.count(r)?;
        let p = self.search(r, key)?;
        let Some((at, n)) = p.succ.filter(|(_, n)| n.key == key) else {
            return Ok(None);
        };
        for (l, (pa, pn)) in p.preds.iter().enumerate().take(n.next.len()) {
            if untag(pn.next[l]).0 == at {
                r.write(pa + (HDR + 8 * l) as u64, &n.next[l].to_le_bytes())?;
            }
        }
        r.free(at, node_size(n.next.len()) as u64)?;
        r.write(self.meta + 8, &(count - 1).to_le_bytes())?;
        Ok(Some(n.value))
    }

    /// Every pair in key order, along level 0.
    pub fn items(&self, r: &mut Remote) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut at = Self::read_node(r, self.head, MAX_HEIGHT)?.next[0];
        while at != 0 {
            let (a, h) = untag(at);
            let n = Self::read_node(r, a, h)?;
            out.push((n.key, n.value));
            at = n.next[0];
        }
        Ok(out)
    }
}

/// A next pointer carries its node's height minus one in its low four
/// bits (blocks are 16-byte aligned), so every node is read whole, once.
fn tag(addr: u64, height: usize) -> u64 {
    addr | (height as u64 - 1)
}

fn untag(p: u64) -> (u64, usize) {
    (p & !15, (p & 15) as usize + 1)
}

/// Cache depth of a node: the taller, the shallower (0 = head and metadata).
fn depth(height: usize) -> u32 {
    (8 - height.min(7) as u32).max(1)
}

impl Replay for SkipList {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEL) if op.len() == 9 => self.do_remove(r, u64_at(op, 1)).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a skiplist operation: {op:?}"))),
        }
    }
}
