//! A second engine: a persistent hash table with an ordered index in DRAM
//! (KVS B+Tree index §2): point operations go to a hash table in the pool;
//! an in-memory concurrent B+-tree over the keys adds range and prefix
//! queries, and is rebuilt from the table at open.
//!
//! # The table (`table.rs`, `layout.rs`)
//!
//! Extendible hashing in the style of CCEH and Dash:
//!
//! ```text
//! root word ──> directory { u64 depth | TAG << 32, u64 entry[2^depth] }
//!               entry = segment offset | local depth (low 6 bits)
//! segment   = 16 buckets of 256 bytes
//! bucket    = { u64 header, slot[7] }    header: valid bit per slot,
//!                                         one fingerprint byte per slot
//! slot      = { key_word, blob, value_word, meta }   (32 bytes)
//! ```
//!
//! The directory index is the top `depth` bits of the key's hash, the home
//! bucket its low 4 bits, the fingerprint the next 8; a key lives in its
//! home bucket or the next one. Keys and values of up to 8 bytes are inline
//! in the slot, longer ones in one blob per slot (the layout of
//! `format/blob.rs`).
//!
//! # Crash consistency
//!
//! - Every write publishes with one 8-byte store of a bucket header, after
//!   the slot (and its blob) is flushed and fenced: an insert sets a bit,
//!   an update sets the new slot's bit and clears the old one in the same
//!   word, a delete clears it. A slot whose bit is not set is never read,
//!   so an unpublished slot is never visible (the CCEH bug where a reader
//!   could see a slot before it was complete cannot happen).
//! - A split never changes the old segment or directory: it writes two new
//!   segments and a new directory (doubled when needed), flushes and fences
//!   them, then swaps the root word. Directory doubling is thus one atomic
//!   store, not a sequence of in-place entry updates (the CCEH doubling
//!   bug). Copying the directory costs O(2^depth) per split; updating
//!   entries in place for segments below the global depth is a later
//!   optimisation that needs its own recovery argument.
//! - Nothing is logged. The allocator is rebuilt by reachability
//!   ([`table::HashTable::recover`] lists every referenced block), so a crash
//!   between allocating and publishing leaks nothing.
//!
//! Every flush and fence names a point in `points.rs`; the crash tests in
//! `tests.rs` crash at each of them and drop each one in turn.
//!
//! # The ordered index (`index.rs`)
//!
//! See [`index::Index`]: a concurrent B+-tree in DRAM, rebuilt from the
//! table at open.

#![allow(
    dead_code,
    reason = "the engine is not wired into Db yet; until then only its tests use all of it"
)]

pub(crate) mod index;
pub(crate) mod layout;
pub(crate) mod points;
pub(crate) mod table;

#[cfg(test)]
mod tests;
