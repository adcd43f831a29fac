//! Hash table with separate chaining (AsymNVM §8.2, §9.2): a fixed array of
//! 16-byte buckets, each the head of a chain of 80-byte nodes
//! `{next, key, value[64]}` and a summary word: the chain's length
//! (saturating) in its top byte and, while the chain has at most
//! [`FPS`] nodes, a one-byte fingerprint of each of its keys. New keys are
//! pushed at the head of their chain. A key whose fingerprint the summary
//! does not hold is absent, so an insert of a new key reads its bucket and
//! no node. The metadata object `{buckets, nbuckets, count}` (the count's
//! top byte holds the bucket [`LAYOUT`]) is cached at
//! depth 0, buckets at depth 1 and chain nodes at depth 2, so with a
//! warm cache an insert needs no remote read; every write operation is one
//! operation log and its writes are memory logs.

use super::{op_log, u64_at, value64, Replay, VALUE};
use crate::{Error, Remote, Result};

const NODE: u64 = 16 + VALUE as u64;
const META: usize = 24;
/// The bucket layout this build writes, in the top byte of the metadata's
/// count word: 2 since buckets carry a summary word (layout 1 had 8-byte
/// buckets and left the byte 0). A table of another layout is refused
/// when opened instead of misread.
pub const LAYOUT: u64 = 2;
const LAYOUT_SHIFT: u32 = 56;
const COUNT_MASK: u64 = (1 << LAYOUT_SHIFT) - 1;
/// Bytes per bucket: the chain's head and its summary word.
pub const BUCKET: u64 = 16;
/// Fingerprints a summary word holds (its top byte is the chain length).
pub const FPS: usize = 7;
const OP_PUT: u8 = 1;
const OP_DEL: u8 = 2;

/// A node found on a chain: `(previous node or 0, address, bytes)`.
type Found = (u64, u64, Vec<u8>);

/// The one-byte fingerprint of `key` in a bucket's summary (never 0, which
/// marks a free byte), from other bits than [`bucket_of`] uses.
pub fn fingerprint(key: u64) -> u8 {
    ((key.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 56) as u8).max(1)
}

/// The summary of a chain holding `keys`.
pub fn summary_of(keys: &[u64]) -> u64 {
    let mut s = (keys.len().min(255) as u64) << 56;
    if keys.len() <= FPS {
        for (i, k) in keys.iter().enumerate() {
            s |= (fingerprint(*k) as u64) << (8 * i);
        }
    }
    s
}

/// Whether a chain with summary `s` may hold `key` (it does not if not).
pub fn may_hold(s: u64, key: u64) -> bool {
    let len = (s >> 56) as usize;
    if len > FPS {
        return true;
    }
    let fp = fingerprint(key);
    (0..len).any(|i| (s >> (8 * i)) as u8 == fp)
}

/// The summary after pushing `key` on a chain whose summary was `s`.
fn summary_push(s: u64, key: u64) -> u64 {
    let len = (s >> 56) as usize;
    let mut t = (((len + 1).min(255)) as u64) << 56 | (s & ((1 << 56) - 1));
    if len < FPS {
        t |= (fingerprint(key) as u64) << (8 * len);
    }
    t
}

/// A hash table of `u64` keys and 64-byte values on a back-end.
pub struct HashTable {
    meta: u64,
    buckets: u64,
    nbuckets: u64,
}

/// The bucket of `key` among `nbuckets` (a power of two): Fibonacci hashing.
pub fn bucket_of(key: u64, nbuckets: u64) -> u64 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 32) & (nbuckets - 1)
}

impl HashTable {
    /// Opens the table named `name`, or creates it with `nbuckets` buckets
    /// (rounded up to a power of two).
    pub fn open(r: &mut Remote, name: &str, nbuckets: u64) -> Result<HashTable> {
        if let Some(meta) = r.name_get(name)? {
            let b = r.read(meta, META, 0)?;
            let layout = u64_at(&b, 16) >> LAYOUT_SHIFT;
            if layout != LAYOUT {
                return Err(Error::NotAPool(format!(
                    "hash table `{name}` has bucket layout {} and this build reads layout {LAYOUT}: \
                     it was written by another build; recreate it under a new name",
                    layout.max(1)
                )));
            }
            return Ok(HashTable {
                meta,
                buckets: u64_at(&b, 0),
                nbuckets: u64_at(&b, 8),
            });
        }
        let nbuckets = nbuckets.max(1).next_power_of_two();
        let buckets = r.alloc(nbuckets * BUCKET)?;
        r.write(buckets, &vec![0u8; (nbuckets * BUCKET) as usize])?;
        let meta = r.alloc(META as u64)?;
        let t = HashTable {
            meta,
            buckets,
            nbuckets,
        };
        let mut b = Vec::with_capacity(META);
        for w in [buckets, nbuckets, LAYOUT << LAYOUT_SHIFT] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        r.write_new(meta, &b, 0)?;
        r.flush()?;
        r.name_set(name, meta)?;
        Ok(t)
    }

    pub fn nbuckets(&self) -> u64 {
        self.nbuckets
    }

    fn slot(&self, key: u64) -> u64 {
        self.buckets + BUCKET * bucket_of(key, self.nbuckets)
    }

    fn count(&self, r: &mut Remote) -> Result<u64> {
        Ok(u64_at(&r.read(self.meta, META, 0)?, 16) & COUNT_MASK)
    }

    fn set_count(&self, r: &mut Remote, count: u64) -> Result<()> {
        r.write(self.meta + 16, &(count | LAYOUT << LAYOUT_SHIFT).to_le_bytes())
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        self.count(r)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// Walks `key`'s chain: its head and summary, and the key's `(previous
    /// node or 0, node address, node bytes)` if present. Reads no node when
    /// the summary rules the key out.
    fn find(&self, r: &mut Remote, key: u64) -> Result<(u64, u64, Option<Found>)> {
        let b = r.read(self.slot(key), BUCKET as usize, 1)?;
        let (head, summary) = (u64_at(&b, 0), u64_at(&b, 8));
        if !may_hold(summary, key) {
            return Ok((head, summary, None));
        }
        let (mut prev, mut at) = (0u64, head);
        while at != 0 {
            let n = r.read(at, NODE as usize, 2)?;
            if u64_at(&n, 8) == key {
                return Ok((head, summary, Some((prev, at, n))));
            }
            prev = at;
            at = u64_at(&n, 0);
        }
        Ok((head, summary, None))
    }

    /// The keys on the chain starting at `at`, in chain order.
    fn chain_keys(r: &mut Remote, mut at: u64) -> Result<Vec<u64>> {
        let mut keys = Vec::new();
        while at != 0 {
            let n = r.read(at, NODE as usize, 2)?;
            keys.push(u64_at(&n, 8));
            at = u64_at(&n, 0);
        }
        Ok(keys)
    }

    /// The value of `key`.
    pub fn get(&self, r: &mut Remote, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.find(r, key)?.2.map(|(_, _, n)| n[16..].to_vec()))
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

    fn do_put(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let count = self.count(r)?;
        let (head, summary, found) = self.find(r, key)?;
        if let Some((_, at, _)) = found {
            return r.write(at + 16, value);
        }
        let n = r.alloc(NODE)?;
        let mut node = Vec::with_capacity(NODE as usize);
        node.extend_from_slice(&head.to_le_bytes());
        node.extend_from_slice(&key.to_le_bytes());
        node.extend_from_slice(value);
        r.write_new(n, &node, 2)?;
        let mut bucket = n.to_le_bytes().to_vec();
        bucket.extend_from_slice(&summary_push(summary, key).to_le_bytes());
        r.write(self.slot(key), &bucket)?;
        self.set_count(r, count + 1)
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
        let (head, _, found) = self.find(r, key)?;
        let Some((prev, at, n)) = found else {
            return Ok(None);
        };
        let next = &n[..8];
        if prev != 0 {
            r.write(prev, next)?;
        }
        // The summary of what stays on the chain (the whole chain read).
        let mut rest = Self::chain_keys(r, head)?;
        rest.retain(|k| *k != key);
        let new_head = if prev == 0 { u64_at(next, 0) } else { head };
        let mut bucket = new_head.to_le_bytes().to_vec();
        bucket.extend_from_slice(&summary_of(&rest).to_le_bytes());
        r.write(self.slot(key), &bucket)?;
        r.free(at, NODE)?;
        self.set_count(r, count - 1)?;
        Ok(Some(n[16..].to_vec()))
    }

    /// Every pair, bucket by bucket (all bucket words in one round trip on a miss).
    pub fn items(&self, r: &mut Remote) -> Result<Vec<(u64, Vec<u8>)>> {
        let slots: Vec<(u64, usize, u32)> = (0..self.nbuckets)
            .map(|i| (self.buckets + BUCKET * i, BUCKET as usize, 1))
            .collect();
        let heads = r.read_many(&slots)?;
        let mut out = Vec::new();
        for h in heads {
            let mut at = u64_at(&h, 0);
            while at != 0 {
                let n = r.read(at, NODE as usize, 2)?;
                out.push((u64_at(&n, 8), n[16..].to_vec()));
                at = u64_at(&n, 0);
            }
        }
        Ok(out)
    }
}

impl Replay for HashTable {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_PUT) if op.len() == 9 + VALUE => self.do_put(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEL) if op.len() == 9 => self.do_remove(r, u64_at(op, 1)).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a hash-table operation: {op:?}"))),
        }
    }
}
