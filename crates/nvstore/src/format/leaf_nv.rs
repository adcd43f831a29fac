//! NV-Tree leaf node (NV-Tree §4.3–4.4).
//!
//! ```text
//! line 0: { u64 count | u64 next | u64 size | u64 compact | u64 compact_version
//!         | u64 reserved[3] }
//! then:   compact[compact], 16 bytes each: { u64 key_word | u64 value_word }
//! then, from the next 32-byte boundary:
//!         element[..], 32 bytes each:
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
//!   split/replace/merge of NV-Tree §4.4 swaps new leaves in by storing the
//!   predecessor's `next` (or the header's leaf head) with one atomic store.
//! - `size` (bytes, a multiple of 64) is written before the leaf is linked
//!   and never changes; capacity follows from it.
//! - `version` is the commit timestamp of the write (NV-Tree §6.1.1). Elements of
//!   one key sit in a leaf in timestamp order. A snapshot at `ts` sees, per
//!   key, the newest element with `version <= ts`.
//! - Compact prefix: a leaf built by a split, replace or merge stores its
//!   *settled* elements in 16 bytes, elements 0..`compact`: positive, not
//!   TXN, key and value exactly 8 bytes inline, and a version no live or
//!   future snapshot is older than. Each reads as a full element with
//!   `key_len = value_len = 8`, no blob and version `compact_version` (the
//!   largest version among them: still no newer than any reader, so every
//!   reader sees them, and never below a version they replace, so the clock
//!   restarted from the leaves stays above every version ever stored). At
//!   most one compact entry per key, the key's oldest element in the leaf;
//!   the prefix is in strictly increasing key order, so a search stops at
//!   the first larger key. A settled element may also be stored full (a
//!   rewrite does so for one or two, so its elements end on a line
//!   boundary and the next update's pair flushes one line). `compact` and `compact_version` are written with the
//!   leaf, before it is linked, and never change; 0 in leaves written before
//!   the prefix existed (which open unchanged). A split halves the bytes it
//!   copies: 16 instead of 32 per kept element.
//! - Full elements start at the first 32-byte boundary after the prefix, so
//!   an appended element never straddles a cache line. [`capacity`] holds
//!   whatever the prefix length: the 16 bytes each compact entry saves pay
//!   for the alignment gap.
//! - `TXN` marks an element of a transaction that spans several leaves: it
//!   counts only once the header's `txn_commit` word is `>= version`. Such a
//!   transaction holds every leaf it appends to until its commit record is
//!   durable, so its elements are the last ones of each leaf.
//! - Recovery rule: every published element was persisted before its count;
//!   elements past `count` are ignored and overwritten by the next append.
//!   Trailing TXN elements newer than `txn_commit` belong to a transaction
//!   that never committed: recovery lowers `count` below them (never below
//!   `compact`: compact entries are never TXN).

use crate::pmem::{Space, LINE};

pub const COUNT_OFF: u64 = 0;
pub const NEXT_OFF: u64 = 8;
pub const SIZE_OFF: u64 = 16;
pub const COMPACT_OFF: u64 = 24;
pub const COMPACT_VERSION_OFF: u64 = 32;
pub const ELEMS_OFF: u64 = LINE;
pub const ELEM_SIZE: u64 = 32;
pub const COMPACT_SIZE: u64 = 16;

pub const C_KEY_WORD: u64 = 0;
pub const C_VALUE_WORD: u64 = 8;

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

/// Bytes from the start of the leaf to its first full element, after
/// `compact` entries.
#[inline]
pub const fn full_start(compact: u64) -> u64 {
    ELEMS_OFF + (compact * COMPACT_SIZE).next_multiple_of(ELEM_SIZE)
}

/// Metadata of every compact entry, given the leaf's `compact_version`.
#[inline]
pub const fn compact_meta(version: u64) -> u64 {
    (8 << KEY_LEN_SHIFT) | (8 << VALUE_LEN_SHIFT) | (version & VERSION_MASK)
}

/// Where the elements of one leaf sit: the read view every element access
/// goes through (search, collate, recovery, check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub leaf: u64,
    /// Compact entries at the start of the leaf.
    pub compact: u64,
    /// The version every compact entry reads as.
    pub compact_version: u64,
}

impl Layout {
    /// Reads the layout words of the leaf at `leaf` (written before it was
    /// linked, so any reader that reached it sees them).
    #[inline]
    pub fn read<S: Space>(s: &S, leaf: u64) -> Layout {
        Layout {
            leaf,
            compact: s.read_u64(leaf + COMPACT_OFF),
            compact_version: s.read_u64(leaf + COMPACT_VERSION_OFF),
        }
    }

    /// Whether the prefix fits a leaf of `size` bytes holding `count`
    /// elements (for recovery and `check`: words read from a damaged pool).
    pub fn valid(&self, size: u64, count: u64) -> bool {
        self.compact <= count && count <= capacity(size) && (self.compact == 0 || self.compact_version <= VERSION_MASK)
    }

    /// Offset of full element `i` (`i >= compact`).
    #[inline]
    pub fn elem(&self, i: u64) -> u64 {
        debug_assert!(i >= self.compact);
        self.leaf + full_start(self.compact) + (i - self.compact) * ELEM_SIZE
    }

    /// The key word of element `i`.
    #[inline]
    pub fn key_word<S: Space>(&self, s: &S, i: u64) -> u64 {
        if i < self.compact {
            s.read_u64(self.leaf + ELEMS_OFF + i * COMPACT_SIZE + C_KEY_WORD)
        } else {
            s.read_u64(self.elem(i) + E_KEY_WORD)
        }
    }

    /// Element `i` decoded as the four words of a full element: the one
    /// way to read an element.
    #[inline]
    pub fn words<S: Space>(&self, s: &S, i: u64) -> [u64; 4] {
        if i < self.compact {
            let c = self.leaf + ELEMS_OFF + i * COMPACT_SIZE;
            [
                s.read_u64(c + C_KEY_WORD),
                0,
                s.read_u64(c + C_VALUE_WORD),
                compact_meta(self.compact_version),
            ]
        } else {
            let e = self.elem(i);
            [
                s.read_u64(e + E_KEY_WORD),
                s.read_u64(e + E_BLOB),
                s.read_u64(e + E_VALUE_WORD),
                s.read_u64(e + E_META),
            ]
        }
    }
}

/// Whether an element with these words may be stored compact (the version
/// condition is the caller's: see the module docs).
pub fn compactable(words: &[u64; 4]) -> bool {
    words[3] & !VERSION_MASK == compact_meta(0) && words[1] == 0
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

    #[test]
    fn capacity_holds_for_every_prefix_length() {
        for size in [MIN_SIZE, 256, 1024, 4096, 64 * 1024] {
            let cap = capacity(size);
            for compact in 0..=cap {
                let end = full_start(compact) + (cap - compact) * ELEM_SIZE;
                assert!(end <= size, "size {size}, compact {compact}: ends at {end}");
                assert_eq!(full_start(compact) % ELEM_SIZE, 0);
            }
        }
        let m = Meta::decode(compact_meta(77)).unwrap();
        assert_eq!(
            m,
            Meta {
                negative: false,
                key_inline: Some(8),
                value_inline: Some(8),
                txn: false,
                version: 77
            }
        );
        assert!(compactable(&[1, 0, 2, m.encode()]));
        assert!(!compactable(&[1, 0, 2, m.encode() | NEGATIVE]));
        assert!(!compactable(&[1, 0, 2, m.encode() | TXN]));
    }
}
