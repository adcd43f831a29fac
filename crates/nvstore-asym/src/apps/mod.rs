//! The transaction benchmarks of AsymNVM §9.3, run by a front-end on
//! back-end memory: SmallBank over the hash table and TATP over the
//! B+-tree.
//!
//! A transaction reads first and decides; if it writes, its writes go
//! into one operation whose operation log is the transaction's name and
//! parameters (one log per transaction, not one per updated key), so in
//! rcb mode it is acknowledged when its log is durable and a writer that
//! dies is recovered by re-executing the logged transactions exactly once
//! ([`crate::structures::recover`]). Re-execution is deterministic: a
//! transaction's effect depends only on its parameters and the state
//! before it. Read-only and aborted transactions log nothing.
//!
//! Loading is logged too, as transactions "load rows `lo..hi`" whose rows
//! are a function of the row number, so a loader that dies recovers the
//! same way.

pub mod smallbank;
pub mod tatp;

pub use smallbank::SmallBank;
pub use tatp::Tatp;

use crate::{Error, Result};

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It wrote (one operation) and is durable.
    Committed,
    /// It only read; the values it read.
    Read(Vec<u64>),
    /// Its condition failed (insufficient funds, a missing or duplicate
    /// row): nothing written, nothing logged.
    Aborted,
}

/// SplitMix64: row contents and balances derived from a seed and a row number.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An operation log: opcode then little-endian words.
pub(crate) fn tx_log(code: u8, words: &[u64]) -> Vec<u8> {
    let mut o = Vec::with_capacity(1 + 8 * words.len());
    o.push(code);
    for w in words {
        o.extend_from_slice(&w.to_le_bytes());
    }
    o
}

/// The words of an operation log of `n` words.
pub(crate) fn tx_words(op: &[u8], n: usize, what: &str) -> Result<Vec<u64>> {
    if op.len() != 1 + 8 * n {
        return Err(Error::Protocol(format!("not a {what} transaction: {op:?}")));
    }
    Ok((0..n).map(|i| crate::structures::u64_at(op, 1 + 8 * i)).collect())
}
