//! Blob: out-of-line key and value bytes of one element (docs/design.md, "Write paths").
//!
//! ```text
//! { u32 key_len | u32 value_len | u8 key[key_len] | u8 value[value_len] }
//! ```
//!
//! Only the parts that do not fit inline are stored: `key_len` is 0 when the
//! element's key is inline, `value_len` 0 when its value is inline. A blob is
//! written, flushed and fenced (with the element) before the count that
//! publishes the element, and never changes afterwards.

use crate::pmem::{Point, Space};

/// Where the bytes start: after the header word ([`header_word`]).
pub const DATA_OFF: u64 = 8;

/// Address of the key bytes of the blob at `blob`.
#[inline]
pub const fn key_at(blob: u64) -> u64 {
    blob + DATA_OFF
}

/// Address of the value bytes of the blob at `blob` holding a key of
/// `key_len` bytes.
#[inline]
pub const fn value_at(blob: u64, key_len: u64) -> u64 {
    blob + DATA_OFF + key_len
}

/// Bytes a blob needs.
pub fn size(key_len: usize, value_len: usize) -> u64 {
    DATA_OFF + key_len as u64 + value_len as u64
}

/// Encodes the blob header word.
pub fn header_word(key_len: usize, value_len: usize) -> u64 {
    key_len as u64 | ((value_len as u64) << 32)
}

/// Decodes the header word into (key_len, value_len).
pub fn lens(word: u64) -> (u64, u64) {
    (word & 0xffff_ffff, word >> 32)
}

/// Writes the blob of the out-of-line parts `key` and `value` (either may
/// be empty) at `off`, straight into the space (no staging copy of the
/// value), and flushes it at `point`. The caller's fence orders it before
/// the store that publishes it.
pub fn write<S: Space>(s: &S, off: u64, key: &[u8], value: &[u8], point: Point) {
    s.write(off, &header_word(key.len(), value.len()).to_le_bytes());
    if !key.is_empty() {
        s.write(key_at(off), key);
    }
    if !value.is_empty() {
        s.write(value_at(off, key.len() as u64), value);
    }
    s.flush(off, size(key.len(), value.len()), point);
}
