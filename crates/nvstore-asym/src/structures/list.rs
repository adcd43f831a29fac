//! Queue and stack: singly linked lists of 80-byte nodes `{next, key, value[64]}`
//! (AsymNVM §8.1). The metadata object `{head, tail, len}` and the nodes
//! near the ends are cached (depth 0), so in rc and rcb modes an operation
//! needs no remote read.

use super::{op_log, open_meta, u64_at, Replay, VALUE};
use crate::{Error, Remote, Result};

const NODE: u64 = 16 + VALUE as u64;
const META: usize = 24;

const OP_ENQ: u8 = 1;
const OP_DEQ: u8 = 2;

fn node(next: u64, key: u64, value: &[u8]) -> Vec<u8> {
    let mut n = Vec::with_capacity(NODE as usize);
    n.extend_from_slice(&next.to_le_bytes());
    n.extend_from_slice(&key.to_le_bytes());
    let mut v = [0u8; VALUE];
    let k = value.len().min(VALUE);
    v[..k].copy_from_slice(&value[..k]);
    n.extend_from_slice(&v);
    n
}

/// A FIFO queue of `(key, value)` items.
pub struct Queue {
    meta: u64,
}

/// A LIFO stack of `(key, value)` items.
pub struct Stack {
    meta: u64,
}

struct Meta {
    head: u64,
    tail: u64,
    len: u64,
}

fn meta(r: &mut Remote, at: u64) -> Result<Meta> {
    let b = r.read(at, META, 0)?;
    Ok(Meta {
        head: u64_at(&b, 0),
        tail: u64_at(&b, 8),
        len: u64_at(&b, 16),
    })
}

fn put_meta(r: &mut Remote, at: u64, m: &Meta) -> Result<()> {
    let mut b = Vec::with_capacity(META);
    for w in [m.head, m.tail, m.len] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    r.write(at, &b)
}

/// Unlinks the head node: returns its key and value.
fn pop_head(r: &mut Remote, at: u64) -> Result<Option<(u64, Vec<u8>)>> {
    let mut m = meta(r, at)?;
    if m.head == 0 {
        return Ok(None);
    }
    let n = r.read(m.head, NODE as usize, 0)?;
    let old = m.head;
    m.head = u64_at(&n, 0);
    if m.head == 0 {
        m.tail = 0;
    }
    m.len -= 1;
    put_meta(r, at, &m)?;
    r.free(old, NODE)?;
    Ok(Some((u64_at(&n, 8), n[16..].to_vec())))
}

impl Queue {
    /// Opens (or creates) the queue named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<Queue> {
        Ok(Queue {
            meta: open_meta(r, name, META)?,
        })
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(meta(r, self.meta)?.len)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// Appends an item at the tail; durable when it returns.
    pub fn enqueue(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_ENQ, key, value));
        self.do_enqueue(r, key, value)?;
        r.commit()
    }

    fn do_enqueue(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let mut m = meta(r, self.meta)?;
        let n = r.alloc(NODE)?;
        r.write_new(n, &node(0, key, value), 0)?;
        if m.tail == 0 {
            m.head = n;
        } else {
            r.write(m.tail, &n.to_le_bytes())?;
        }
        m.tail = n;
        m.len += 1;
        put_meta(r, self.meta, &m)
    }

    /// Removes the item at the head; durable when it returns.
    pub fn dequeue(&mut self, r: &mut Remote) -> Result<Option<(u64, Vec<u8>)>> {
        r.begin(&op_log(OP_DEQ, 0, &[]));
        let v = pop_head(r, self.meta)?;
        r.commit()?;
        Ok(v)
    }

    /// Every item, head first (reads each node).
    pub fn items(&self, r: &mut Remote) -> Result<Vec<(u64, Vec<u8>)>> {
        let head = meta(r, self.meta)?.head;
        walk(r, head)
    }
}

impl Replay for Queue {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_ENQ) => self.do_enqueue(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEQ) => pop_head(r, self.meta).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a queue operation: {op:?}"))),
        }
    }
}

impl Stack {
    /// Opens (or creates) the stack named `name`.
    pub fn open(r: &mut Remote, name: &str) -> Result<Stack> {
        Ok(Stack {
            meta: open_meta(r, name, META)?,
        })
    }

    pub fn len(&self, r: &mut Remote) -> Result<u64> {
        Ok(meta(r, self.meta)?.len)
    }

    pub fn is_empty(&self, r: &mut Remote) -> Result<bool> {
        Ok(self.len(r)? == 0)
    }

    /// Pushes an item; durable when it returns.
    pub fn push(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        r.begin(&op_log(OP_ENQ, key, value));
        self.do_push(r, key, value)?;
        r.commit()
    }

    fn do_push(&mut self, r: &mut Remote, key: u64, value: &[u8]) -> Result<()> {
        let mut m = meta(r, self.meta)?;
        let n = r.alloc(NODE)?;
        r.write_new(n, &node(m.head, key, value), 0)?;
        m.head = n;
        m.len += 1;
        put_meta(r, self.meta, &m)
    }

    /// Pops the top item; durable when it returns.
    pub fn pop(&mut self, r: &mut Remote) -> Result<Option<(u64, Vec<u8>)>> {
        r.begin(&op_log(OP_DEQ, 0, &[]));
        let v = pop_head(r, self.meta)?;
        r.commit()?;
        Ok(v)
    }

    /// Every item, top first.
    pub fn items(&self, r: &mut Remote) -> Result<Vec<(u64, Vec<u8>)>> {
        let head = meta(r, self.meta)?.head;
        walk(r, head)
    }
}

impl Replay for Stack {
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()> {
        match op.first() {
            Some(&OP_ENQ) => self.do_push(r, u64_at(op, 1), &op[9..]),
            Some(&OP_DEQ) => pop_head(r, self.meta).map(|_| ()),
            _ => Err(Error::Protocol(format!("not a stack operation: {op:?}"))),
        }
    }
}

fn walk(r: &mut Remote, mut at: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    while at != 0 {
        let n = r.read(at, NODE as usize, 1)?;
        out.push((u64_at(&n, 8), n[16..].to_vec()));
        at = u64_at(&n, 0);
    }
    Ok(out)
}
