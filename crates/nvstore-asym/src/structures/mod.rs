//! Data structures run by a front-end on back-end memory (AsymNVM §8).
//!
//! Each keeps its metadata object's address under a name in the back-end's
//! naming space, describes every write operation by an operation log (its
//! opcode and arguments), and re-executes unapplied operation logs when a
//! writer restarts ([`recover`]). Values are 64 bytes (AsymNVM §9.2).

pub mod bptree;
pub mod hash;
pub mod list;
pub mod skiplist;

pub use bptree::BpTree;
pub use hash::HashTable;
pub use list::{Queue, Stack};
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

pub(crate) fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}
