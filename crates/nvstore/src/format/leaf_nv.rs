//! NV-Tree leaf node (seed 000 §4.3–4.4).
//!
//! ```text
//! line 0: { u64 count | u64 next | u64 size | u64 reserved[5] }
//! then:   element[capacity], 32 bytes each:
//!         { u64 key_word | u64 blob | u64 value_word | u64 meta }
//! meta:   bit 63 NEGATIVE | bits 56..59 key_len (0..8, or 15 = in blob)
//!         | bits 52..55 value_len (0..8, or 15 = in blob) | bit 48 TXN
//!         | bits 0..47 version (commit timestamp; 0 in pools written before MVCC)
//! ```
//!
//! - Elements are unsorted and append-only. `count` publishes them: an
//!   element at index >= count does not exist. Insert writes the element,
//!   flushes and fences it, then stores count+1, flushes and fences (2 line
//!   flushes per insert, as the paper). Update appends NEGATIVE + new and
//!   publishes both with one count store.
//! - `key_word` holds the first min(8, len) key bytes big-endian, zero padded,
//!   so comparing words orders keys by their first 8 bytes; a longer key
//!   lives in the blob and the word is its prefix (most mismatches never read
//!   the blob).
//! - `next` is the right sibling's offset (0 at the end of the chain); the
//!   split/replace/merge of seed 000 §4.4 swaps new leaves in by storing the
//!   predecessor's `next` (or the header's leaf head) with one atomic store.
//! - `size` (bytes, a multiple of 64) is written before the leaf is linked
//!   and never changes; capacity follows from it.
//! - `version` is the commit timestamp of the write (DESIGN §11). Elements of
//!   one key sit in a leaf in timestamp order. A snapshot at `ts` sees, per
//!   key, the newest element with `version <= ts`.
//! - `TXN` marks an element of a transaction that spans several leaves: it
//!   counts only once the header's `txn_commit` word is `>= version`. Such a
//!   transaction holds every leaf it appends to until its commit record is
//!   durable, so its elements are the last ones of each leaf.
//! - Recovery rule: every published element was persisted before its count;
//!   elements past `count` are ignored and overwritten by the next append.
//!   Trailing TXN elements newer than `txn_commit` belong to a transaction
//!   that never committed: recovery lowers `count` below them.

use crate::pmem::LINE;

pub const COUNT_OFF: u64 = 0;
pub const NEXT_OFF: u64 = 8;
pub const SIZE_OFF: u64 = 16;
pub const ELEMS_OFF: u64 = LINE;
pub const ELEM_SIZE: u64 = 32;

pub const E_KEY_WORD: u64 = 0;
pub const E_BLOB: u64 = 8;
pub const E_VALUE_WORD: u64 = 16;
pub const E_META: u64 = 24;

pub const NEGATIVE: u64 = 1 << 63;
pub const TXN: u64 = 1 << 48;
pub const LEN_IN_BLOB: u64 = 15;
const KEY_LEN_SHIFT: u32 = 56;
const VALUE_LEN_SHIFT: u32 = 52;
pub const VERSION_MASK: u64 = (1 << 48) - 1;

/// Smallest leaf: a header line and two lines of elements.
pub const MIN_SIZE: u64 = 3 * LINE;

/// Elements a leaf of `size` bytes holds.
pub const fn capacity(size: u64) -> u64 {
    (size - ELEMS_OFF) / ELEM_SIZE
}

/// Offset of element `i` in the leaf at `leaf`.
#[inline]
pub const fn elem(leaf: u64, i: u64) -> u64 {
    leaf + ELEMS_OFF + i * ELEM_SIZE
}

/// The order-preserving first word of a key.
#[inline]
pub fn key_word(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// Inverse of [`key_word`] for inline keys.
#[inline]
pub fn word_key(word: u64, len: usize) -> Vec<u8> {
    word.to_be_bytes()[..len].to_vec()
}

/// Decoded element metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub negative: bool,
    /// Inline key length, or `None` when the key is in the blob.
    pub key_inline: Option<u8>,
    /// Inline value length, or `None` when the value is in the blob.
    pub value_inline: Option<u8>,
    /// Part of a multi-leaf transaction (see the module docs).
    pub txn: bool,
    pub version: u64,
}

impl Meta {
    pub fn encode(self) -> u64 {
        let kl = self.key_inline.map_or(LEN_IN_BLOB, |l| l as u64);
        let vl = self.value_inline.map_or(LEN_IN_BLOB, |l| l as u64);
        (if self.negative { NEGATIVE } else { 0 })
            | (kl << KEY_LEN_SHIFT)
            | (vl << VALUE_LEN_SHIFT)
            | (if self.txn { TXN } else { 0 })
            | (self.version & VERSION_MASK)
    }

    /// Decodes; `None` for a word no writer produces.
    pub fn decode(w: u64) -> Option<Meta> {
        let kl = (w >> KEY_LEN_SHIFT) & 0xf;
        let vl = (w >> VALUE_LEN_SHIFT) & 0xf;
        if (kl > 8 && kl != LEN_IN_BLOB)
            || (vl > 8 && vl != LEN_IN_BLOB)
            || (w >> 60) & 0x7 != 0
            || (w >> 49) & 0x7 != 0
        {
            return None;
        }
        Some(Meta {
            negative: w & NEGATIVE != 0,
            key_inline: (kl != LEN_IN_BLOB).then_some(kl as u8),
            value_inline: (vl != LEN_IN_BLOB).then_some(vl as u8),
            txn: w & TXN != 0,
            version: w & VERSION_MASK,
        })
    }

    pub fn needs_blob(self) -> bool {
        self.key_inline.is_none() || self.value_inline.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trip() {
        for m in [
            Meta {
                negative: false,
                key_inline: Some(8),
                value_inline: Some(8),
                txn: false,
                version: 0,
            },
            Meta {
                negative: true,
                key_inline: None,
                value_inline: Some(0),
                txn: true,
                version: 12345,
            },
            Meta {
                negative: false,
                key_inline: Some(0),
                value_inline: None,
                txn: false,
                version: VERSION_MASK,
            },
        ] {
            assert_eq!(Meta::decode(m.encode()), Some(m));
        }
        assert_eq!(Meta::decode(9 << KEY_LEN_SHIFT), None);
        assert_eq!(Meta::decode(1 << 49), None);
    }

    #[test]
    fn key_words_order_like_bytes() {
        let keys: [&[u8]; 6] = [b"", b"\0", b"a", b"ab", b"abcdefgh", b"b"];
        for w in keys.windows(2) {
            assert!(key_word(w[0]) <= key_word(w[1]));
        }
        assert_eq!(word_key(key_word(b"abc"), 3), b"abc");
        assert_eq!(capacity(1024), 30);
    }
}
