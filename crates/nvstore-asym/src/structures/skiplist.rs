//! Skiplist (AsymNVM §8.2, §8.4, §9.2): `u64` keys, 64-byte values, at most
//! [`MAX_HEIGHT`] levels. A node is `{key, height, value[64], next[height]}`,
//! and a node of height [`TALL`] or more ends with one more word, its run
//! directory; the head is a node of full height whose key word holds the
//! layout ([`LAYOUT`]) and is never compared. A node's height is a hash of
//! its key (probability 1/4 per extra level), so re-executing an operation
//! log builds exactly the same node.
//!
//! AsymNVM §8.4 caches the nodes of higher degree. Here the tall nodes
//! (height >= [`TALL`], one node in sixteen) are the upper levels the
//! level-aware cache keeps (AsymNVM §5), and each of them (and the head)
//! owns a run directory: the `(key, next pointer)` of every shorter node
//! between it and the next tall node, in key order, in one object. A
//! search walks the cached tall nodes to the predecessor `P` at level
//! `TALL - 1`, then reads `P`'s directory: one read, which in rcb mode
//! carries the operation log, tells whether the key is present, where
//! its node is, and (heights ride in the pointers' low bits) its
//! predecessors and successors on the levels below `TALL - 1`. So a put
//! reads nothing else, and costs one round trip with the tall nodes
//! cached. The bottom levels stay an ordinary linked skiplist (every
//! `next` pointer is kept), so a walk along level 0 needs no directory.
//!
//! A directory is `{count, 0, (key, pointer)[cap]}` with `cap = 8 << e`,
//! and the word that points to it is `address | e`. A tall node inserted
//! into a run takes the directory entries past it; a tall node removed
//! gives its entries back to its predecessor.

use std::collections::HashMap;

use super::{op_log, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

/// Levels of the head node.
pub const MAX_HEIGHT: usize = 12;
/// Nodes of at least this height (and the head) own a run directory.
pub const TALL: usize = 3;
/// The level whose predecessor owns the run a key falls in.
const RUN_LEVEL: usize = TALL - 1;
const HDR: usize = 16 + VALUE;
const META: usize = 16;
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;
/// The head's key word: skiplists whose tall nodes own run directories.
pub const LAYOUT: u64 = u64::from_le_bytes(*b"skipdir1");
const DIR_HDR: usize = 16;
/// Largest directory size exponent: `8 << 15` entries.
const MAX_DIR_EXP: u64 = 15;
/// Cache depth of a directory: kept after the tall nodes, dropped before them.
const DIR_DEPTH: u32 = 6;

fn node_size(height: usize) -> usize {
    HDR + 8 * height + if height >= TALL { 8 } else { 0 }
}

/// Offset of a tall node's directory word.
fn dir_word_at(height: usize) -> usize {
    HDR + 8 * height
}

fn dir_cap(word: u64) -> usize {
    8 << (word & 15)
}

fn dir_addr(word: u64) -> u64 {
    word & !15
}

fn dir_size(cap: usize) -> usize {
    DIR_HDR + 16 * cap
}

/// The directory word for a directory at `addr` with room for at least
/// `n + 1` entries (so the next insert fits), or an error past the limit.
fn dir_exp_for(n: usize) -> Result<u64> {
    let mut e = 0;
    while (8usize << e) <= n {
        e += 1;
        if e > MAX_DIR_EXP {
            return Err(Error::Protocol(format!(
                "skiplist run of {n} nodes between two tall nodes exceeds a directory's {} entries",
                8usize << MAX_DIR_EXP
            )));
        }
    }
    Ok(e)
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
    /// Directory word (tall nodes), else 0.
    dir: u64,
}

impl Node {
    fn parse(b: &[u8]) -> Node {
        let h = (u64_at(b, 8) as usize).clamp(1, MAX_HEIGHT);
        if b.len() < node_size(h) {
            return Node {
                key: u64_at(b, 0),
                value: vec![0; VALUE],
                next: vec![0; 1],
                dir: 0,
            };
        }
        Node {
            key: u64_at(b, 0),
            value: b[16..HDR].to_vec(),
            next: (0..h).map(|l| u64_at(b, HDR + 8 * l)).collect(),
            dir: if h >= TALL { u64_at(b, dir_word_at(h)) } else { 0 },
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let h = self.next.len();
        let mut b = Vec::with_capacity(node_size(h));
        b.extend_from_slice(&self.key.to_le_bytes());
        b.extend_from_slice(&(h as u64).to_le_bytes());
        b.extend_from_slice(&self.value);
        for n in &self.next {
            b.extend_from_slice(&n.to_le_bytes());
        }
        if h >= TALL {
            b.extend_from_slice(&self.dir.to_le_bytes());
        }
        b
    }
}

/// A run directory: the shorter nodes after a tall node, in key order, as
/// `(key, tagged pointer)`.
struct Dir {
    word: u64,
    entries: Vec<(u64, u64)>,
}

impl Dir {
    fn parse(word: u64, b: &[u8]) -> Dir {
        let n = (u64_at(b, 0) as usize).min(dir_cap(word)).min((b.len() - DIR_HDR) / 16);
        Dir {
            word,
            entries: (0..n)
                .map(|i| (u64_at(b, DIR_HDR + 16 * i), u64_at(b, DIR_HDR + 16 * i + 8)))
                .collect(),
        }
    }

    /// The bytes of a directory of room `cap` holding `entries`.
    fn bytes(entries: &[(u64, u64)], cap: usize) -> Vec<u8> {
        let mut b = vec![0u8; dir_size(cap)];
        b[..8].copy_from_slice(&(entries.len() as u64).to_le_bytes());
        for (i, (k, p)) in entries.iter().enumerate() {
            b[DIR_HDR + 16 * i..DIR_HDR + 16 * i + 8].copy_from_slice(&k.to_le_bytes());
            b[DIR_HDR + 16 * i + 8..DIR_HDR + 16 * i + 16].copy_from_slice(&p.to_le_bytes());
        }
        b
    }

    /// Where `key` is: `Ok(index)` or `Err(insertion point)`.
    fn find(&self, key: u64) -> std::result::Result<usize, usize> {
        self.entries.binary_search_by_key(&key, |e| e.0)
    }
}

/// A skiplist on a back-end.
pub struct SkipList {
    meta: u64,
    head: u64,
}

/// Where a search of the tall nodes for a key ended: the predecessor at
/// each level from [`RUN_LEVEL`] up (lower entries repeat the head and
/// are not used), and the tall node after the run (`>= key`), if any.
struct Path {
    preds: Vec<(u64, Node)>,
    succ: Option<(u64, Node)>,
}

impl Path {
    /// The tall node (or head) whose run `key` falls in.
    fn run(&self) -> &(u64, Node) {
        &self.preds[RUN_LEVEL]
    }

    /// The pointer that ends the run: to the next tall node, or 0.
    fn run_end(&self) -> u64 {
        self.run().1.next[RUN_LEVEL]
    }
}

/// The neighbours on level `l < RUN_LEVEL` of the slot `i` of `dir`'s run
/// (the entries before `i` and from `j` on): the address of the last
/// entry before `i` reaching level `l` (or the run's owner `owner`), and
/// the pointer to the first from `j` on (or `end`).
fn low_neighbours(dir: &Dir, i: usize, j: usize, l: usize, owner: u64, end: u64) -> (u64, u64) {
    let reaches = |p: u64| untag(p).1 > l;
    let pred = dir.entries[..i]
        .iter()
        .rev()
        .find(|e| reaches(e.1))
        .map_or(owner, |e| untag(e.1).0);
    let succ = dir.entries[j..].iter().find(|e| reaches(e.1)).map_or(end, |e| e.1);
    (pred, succ)
}

impl SkipList {
    /// Opens (or creates) the skiplist named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<SkipList> {
        if let Some(meta) = r.name_get(name)? {
            let head = u64_at(&r.read(meta, META, 0)?, 0);
            let h = Self::read_node(r, head, MAX_HEIGHT)?;
            if h.key != LAYOUT {
                return Err(Error::Protocol(format!(
                    "skiplist {name:?} has an unknown layout {:#x} (expected run directories, {LAYOUT:#x})",
                    h.key
                )));
            }
            return Ok(SkipList { meta, head });
        }
        let head = r.alloc(node_size(MAX_HEIGHT) as u64)?;
        let e = dir_exp_for(0)?;
        let dir = r.alloc(dir_size(8 << e) as u64)?;
        if dir & 15 != 0 {
            return Err(Error::Protocol(format!("skiplist directory at unaligned {dir:#x}")));
        }
        r.write_new(dir, &Dir::bytes(&[], 8 << e), DIR_DEPTH)?;
        let h = Node {
            key: LAYOUT,
            value: vec![0; VALUE],
            next: vec![0; MAX_HEIGHT],
            dir: dir | e,
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

    /// Reads the directories of `words` (one round trip for all misses).
    fn read_dirs(r: &mut Remote, words: &[u64]) -> Result<Vec<Dir>> {
        let objs: Vec<(u64, usize, u32)> = words
            .iter()
            .map(|w| (dir_addr(*w), dir_size(dir_cap(*w)), DIR_DEPTH))
            .collect();
        Ok(r.read_many(&objs)?
            .iter()
            .zip(words)
            .map(|(b, w)| Dir::parse(*w, b))
            .collect())
    }

    /// Searches the tall nodes for `key`, reading each node once: levels
    /// [`RUN_LEVEL`] and up link tall nodes only, which the cache keeps.
    fn search(&self, r: &mut Remote, key: u64) -> Result<Path> {
        let mut seen: HashMap<u64, Node> = HashMap::new();
        let mut at = self.head;
        let mut node = Self::read_node(r, at, MAX_HEIGHT)?;
        let mut preds = vec![(0, node.clone()); MAX_HEIGHT];
        let mut succ = None;
        for l in (RUN_LEVEL..MAX_HEIGHT).rev() {
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
                    if l == RUN_LEVEL {
                        succ = Some((na, n));
                    }
                    break;
                }
            }
            preds[l] = (at, node.clone());
        }
        for p in preds.iter_mut().take(RUN_LEVEL) {
            *p = (at, node.clone());
        }
        Ok(Path { preds, succ })
    }

    /// The value of `key`: the tall nodes (cached), then the run's
    /// directory, then the node if the directory holds the key.
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        let p = self.search(r, key)?;
        if let Some((_, s)) = p.succ.as_ref().filter(|(_, s)| s.key == key) {
            return Ok(Some(s.value.clone()));
        }
        let dir = Self::read_dirs(r, &[p.run().1.dir])?.pop().unwrap();
        let Ok(i) = dir.find(key) else {
            return Ok(None);
        };
        let (at, h) = untag(dir.entries[i].1);
        let n = Self::read_node(r, at, h)?;
        Ok((n.key == key).then_some(n.value))
    }

    /// Inserts or replaces `key`; durable when it returns.
    pub fn put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_PUT, key, &value64(value)));
        self.do_put(r, key, &value64(value))?;
        r.commit()
    }

    /// Writes `entries` as the directory of the run owned by the node at
    /// `owner` (of height `oh`, directory word `word`): in place if they
    /// fit (only what changed), else into a larger directory that replaces it.
    fn store_dir(r: &mut Remote, owner: u64, oh: usize, old: &Dir, entries: &[(u64, u64)]) -> Result<()> {
        let cap = dir_cap(old.word);
        let at = dir_addr(old.word);
        if entries.len() <= cap {
            let before = Dir::bytes(&old.entries, cap);
            return r.write_changes(at, &before, &Dir::bytes(entries, cap));
        }
        let e = dir_exp_for(entries.len())?;
        let na = r.alloc(dir_size(8 << e) as u64)?;
        if na & 15 != 0 {
            return Err(Error::Protocol(format!("skiplist directory at unaligned {na:#x}")));
        }
        r.write_new(na, &Dir::bytes(entries, 8 << e), DIR_DEPTH)?;
        r.write(owner + dir_word_at(oh) as u64, &(na | e).to_le_bytes())?;
        r.free(at, dir_size(cap) as u64)
    }

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let count = self.count(r)?;
        let p = self.search(r, key)?;
        if let Some((at, n)) = &p.succ {
            if n.key == key {
                return r.write(at + 16, value);
            }
        }
        let (pa, pn) = p.run().clone();
        let dir = Self::read_dirs(r, &[pn.dir])?.pop().unwrap();
        let i = match dir.find(key) {
            Ok(i) => return r.write(untag(dir.entries[i].1).0 + 16, value),
            Err(i) => i,
        };
        let h = height_of(key);
        let at = r.alloc(node_size(h) as u64)?;
        if at & 15 != 0 {
            return Err(Error::Protocol(format!("skiplist node at unaligned {at:#x}")));
        }
        let mut node = Node {
            key,
            value: value.to_vec(),
            next: Vec::with_capacity(h),
            dir: 0,
        };
        let mut preds = Vec::with_capacity(h);
        for l in 0..h {
            if l < RUN_LEVEL {
                let (pred, succ) = low_neighbours(&dir, i, i, l, pa, p.run_end());
                preds.push(pred);
                node.next.push(succ);
            } else {
                preds.push(p.preds[l].0);
                node.next.push(p.preds[l].1.next[l]);
            }
        }
        let mut entries = dir.entries.clone();
        if h >= TALL {
            // The new tall node owns the rest of the run.
            let moved = entries.split_off(i);
            let e = dir_exp_for(moved.len())?;
            let da = r.alloc(dir_size(8 << e) as u64)?;
            if da & 15 != 0 {
                return Err(Error::Protocol(format!("skiplist directory at unaligned {da:#x}")));
            }
            r.write_new(da, &Dir::bytes(&moved, 8 << e), DIR_DEPTH)?;
            node.dir = da | e;
        } else {
            entries.insert(i, (key, tag(at, h)));
        }
        r.write_new(at, &node.bytes(), depth(h))?;
        for (l, pred) in preds.iter().enumerate() {
            r.write(pred + (HDR + 8 * l) as u64, &tag(at, h).to_le_bytes())?;
        }
        Self::store_dir(r, pa, pn.next.len(), &dir, &entries)?;
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
        let (pa, pn) = p.run().clone();
        if let Some((sa, s)) = p.succ.clone().filter(|(_, s)| s.key == key) {
            // A tall node: its run joins its predecessor's (both
            // directories in one round trip).
            let mut dirs = Self::read_dirs(r, &[pn.dir, s.dir])?;
            let sdir = dirs.pop().unwrap();
            let dir = dirs.pop().unwrap();
            let n = dir.entries.len();
            for (l, next) in s.next.iter().enumerate() {
                let pred = if l < RUN_LEVEL {
                    low_neighbours(&dir, n, n, l, pa, 0).0
                } else {
                    p.preds[l].0
                };
                r.write(pred + (HDR + 8 * l) as u64, &next.to_le_bytes())?;
            }
            let mut entries = dir.entries.clone();
            entries.extend_from_slice(&sdir.entries);
            Self::store_dir(r, pa, pn.next.len(), &dir, &entries)?;
            r.free(dir_addr(s.dir), dir_size(dir_cap(s.dir)) as u64)?;
            r.free(sa, node_size(s.next.len()) as u64)?;
            r.write(self.meta + 8, &(count - 1).to_le_bytes())?;
            return Ok(Some(s.value));
        }
        let dir = Self::read_dirs(r, &[pn.dir])?.pop().unwrap();
        let Ok(i) = dir.find(key) else {
            return Ok(None);
        };
        let (at, h) = untag(dir.entries[i].1);
        let n = Self::read_node(r, at, h)?;
        if n.key != key || n.next.len() != h {
            return Err(Error::Protocol(format!(
                "skiplist directory entry {key} points to a node of key {} and height {}",
                n.key,
                n.next.len()
            )));
        }
        for (l, next) in n.next.iter().enumerate() {
            let (pred, _) = low_neighbours(&dir, i, i + 1, l, pa, 0);
            r.write(pred + (HDR + 8 * l) as u64, &next.to_le_bytes())?;
        }
        let mut entries = dir.entries.clone();
        entries.remove(i);
        Self::store_dir(r, pa, pn.next.len(), &dir, &entries)?;
        r.free(at, node_size(h) as u64)?;
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
