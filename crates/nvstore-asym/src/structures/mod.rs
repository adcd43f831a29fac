//! Data structures run by a front-end on back-end memory (AsymNVM §8):
//! queue, stack, B+-tree, hash table, skiplist, BST, and the multi-version
//! BST and B+-tree whose readers take no lock.
//!
//! Each keeps its metadata object's address under a name in the back-end's
//! naming space, describes every write operation by an operation log (its
//! opcode and arguments), and re-executes unapplied operation logs when a
//! writer restarts ([`recover`]). Values are 64 bytes (AsymNVM §9.2).

pub mod bptree;
pub mod bst;
pub mod hash;
pub mod list;
pub mod mvbptree;
pub mod mvbst;
pub mod skiplist;

pub use bptree::BpTree;
pub use bst::Bst;
pub use hash::HashTable;
pub use list::{Queue, Stack};
pub use mvbptree::MvBpTree;
pub use mvbst::MvBst;
pub use skiplist::SkipList;

use crate::{Remote, Result};

/// Value size of the paper's evaluation.
pub const VALUE: usize = 64;

/// A structure whose write operations can be re-executed from their operation logs.
pub trait Replay {
    /// Re-executes one logged operation (inside `begin_replay` … `commit`).
    fn redo(&mut self, r: &mut Remote, op: &[u8]) -> Result<()>;
}

/// Re-executes every operation log the back-end's last transaction does
/// not cover, exactly once each, then flushes (AsymNVM §7, case 2).
pub fn recover(r: &mut Remote, s: &mut impl Replay) -> Result<u64> {
    let ops = r.unapplied_ops()?;
    for (seq, op) in &ops {
        r.begin_replay(*seq);
        s.redo(r, op)?;
        r.commit()?;
    }
    r.flush()?;
    Ok(ops.len() as u64)
}

/// An operation log: opcode, key, then the operation's bytes.
pub(crate) fn op_log(code: u8, key: u64, value: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(9 + value.len());
    o.push(code);
    o.extend_from_slice(&key.to_le_bytes());
    o.extend_from_slice(value);
    o
}

/// Opens the metadata object named `name`, creating it as `len` zero bytes
/// (flushed before it is named) if missing.
pub(crate) fn open_meta(r: &mut Remote, name: &str, len: usize) -> Result<u64> {
    if let Some(a) = r.name_get(name)? {
        return Ok(a);
    }
    let a = r.alloc(len as u64)?;
    r.write_new(a, &vec![0; len], 0)?;
    r.flush()?;
    r.name_set(name, a)?;
    Ok(a)
}

pub(crate) fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

/// `v` cut or zero-padded to [`VALUE`] bytes.
pub(crate) fn value64(v: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; VALUE];
    let k = v.len().min(VALUE);
    out[..k].copy_from_slice(&v[..k]);
    out
}
