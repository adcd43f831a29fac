//! NV-Tree leaf node (NV-Tree §4.3–4.4).
//!
//! ```text
//! line 0: { u64 count | u64 next | u64 size | u64 compact | u64 compact_version
//!         | u64 stamp | u64 gone[2] }
//! then:   compact[compact], 16 bytes each: { u64 key_word | u64 value_word }
//! then, from the next 32-byte boundary:
//!         element[..], 32 bytes each:
//!         { u64 key_word | u64 blob | u64 value_word | u64 meta }
//! meta:   bit 63 NEGATIVE | bit 62 CONT | bits 60..61 check
//!         | bits 56..59 key_len (0..8, or 15 = in blob)
//!         | bits 52..55 value_len (0..8, or 15 = in blob) | bits 49..51 check
//!         | bit 48 TXN | bits 0..47 version (commit timestamp; 0 in pools
//!         written before MVCC)
//! blob:   bits 40..63 check | bits 6..39 blob offset / 64 | bits 0..5 check
//! ```
//!
//! - Elements are unsorted and append-only. In a *sealed* leaf (`stamp`
//!   != 0: every leaf written by a format-3 build) each full element is
//!   self-validating: 35 check bits spread over spare bits of its blob and
//!   meta words (a blob lives below 2^40 on a 64-byte boundary: see
//!   [`seal`]) hash its words, its slot index, the leaf's offset and
//!   `stamp`, and the stored blob and meta words of the element before it
//!   (a chain). An insert writes the element, flushes its line and
//!   fences once: one barrier; it does not store `count`.
//!   Update appends NEGATIVE + new in one group: every element of a group
//!   but the last carries CONT, so a torn group never validates as a
//!   whole. `count` is written when the leaf is built and at clean
//!   shutdown (from the DRAM count); after a crash, recovery takes the longest prefix of valid
//!   groups instead ([`valid_end`]): appends are sequential under the leaf
//!   lock and each is fenced before the next starts, so the valid ones form
//!   a prefix. A torn element fails its check; a stale one of a reused
//!   chunk has another stamp or offset; a stale one of this leaf past the
//!   end (a group cut by a crash, a transaction undone) is chained to an
//!   element that a later append overwrote with a newer version, or to
//!   the one recovery zeroed (undo), so it never validates again.
//! - An unsealed leaf (`stamp` 0: written by a format-2 build) keeps the
//!   paper's protocol (NV-Tree Alg. 2): write the element, flush, fence,
//!   then store count+1, flush, fence. Its count alone decides. Split,
//!   replace and merge rewrite it into sealed leaves.
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
//!   leaf, before it is linked, and never change; nor does an entry's key
//!   word. Its value word may be replaced in place: an update of the key
//!   to another 8-byte value while no snapshot is live stores it, flushes
//!   and fences it (one failure-atomic word: after a crash the entry holds
//!   the old value or the new one), and the entry keeps `compact_version`,
//!   which is still no newer than any reader's timestamp; 0 in leaves written before
//!   the prefix existed (which open unchanged). A split halves the bytes it
//!   copies: 16 instead of 32 per kept element.
//! - `gone` (format 5): bit `i` of the 128 is set when element `i` (a
//!   compact entry or a full element) was deleted in place. A delete while
//!   no snapshot is live sets the bits of every element of its key (its
//!   versions) when they all lie in one of the two words: one 8-byte store,
//!   one flush, one fence, and nothing appended (FPTree's bitmap delete), so
//!   deletes do not fill the leaf with NEGATIVE elements. After a crash the
//!   key is either there or deleted. Every reader reads a gone element as
//!   NEGATIVE ([`Layout::words`]), so collation, recovery and `check` treat
//!   it as any delete, and a rewrite drops it. Bits are set only on
//!   published elements and never cleared (a new leaf starts with none);
//!   the check bits of a full element do not cover them.
//! - Full elements start at the first 32-byte boundary after the prefix, so
//!   an appended element never straddles a cache line. A leaf holds
//!   [`capacity_at`] elements: its compact entries and the full elements
//!   that fit after them, at least [`capacity`] (the count with no prefix)
//!   whatever the prefix length. Format-3 leaves never held more than
//!   [`capacity`]; format 4 lets the bytes the prefix saves take appends.
//! - `TXN` marks an element of a transaction that spans several leaves: it
//!   counts only once the header's `txn_commit` word is `>= version`. Such a
//!   transaction holds every leaf it appends to until its commit record is
//!   durable, so its elements are the last ones of each leaf.
//! - Recovery rule (unsealed leaves): every published element was persisted
//!   before its count; elements past `count` are ignored and overwritten by
//!   the next append. Sealed leaves: see [`valid_end`].
//!   Trailing TXN elements newer than `txn_commit` belong to a transaction
//!   that never committed: recovery lowers `count` below them (never below
//!   `compact`: compact entries are never TXN).

use crate::pmem::{Space, LINE};

pub const COUNT_OFF: u64 = 0;
pub const NEXT_OFF: u64 = 8;
pub const SIZE_OFF: u64 = 16;
pub const COMPACT_OFF: u64 = 24;
pub const COMPACT_VERSION_OFF: u64 = 32;
/// The leaf's incarnation stamp: nonzero in sealed leaves, fresh each time
/// a leaf is built (never the word its chunk held before).
pub const STAMP_OFF: u64 = 40;
/// Two words of deletion bits of elements 0..[`GONE_SLOTS`].
pub const GONE_OFF: u64 = 48;
/// Elements that can be deleted in place (two words of bits).
pub const GONE_SLOTS: u64 = 128;
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
/// Sealed leaves: another element of the same append follows this one.
pub const CONT: u64 = 1 << 62;
/// Check bits in the meta word (5) and in the blob word (30).
const META_CHECK: u64 = (0b11 << 60) | (0b111 << 49);
const BLOB_CHECK: u64 = !((1 << 40) - 1) | 0x3f;
/// The blob offset bits of the blob word (a pool is at most 1 TiB).
pub const BLOB_MASK: u64 = !BLOB_CHECK;
/// The meta word without check bits and CONT: what [`Meta::decode`] reads.
pub const META_MASK: u64 = !(META_CHECK | CONT);
/// Bits of check per element.
pub const CHECK_BITS: u32 = 35;

/// Smallest leaf: a header line and two lines of elements.
pub const MIN_SIZE: u64 = 3 * LINE;

/// Elements a leaf of `size` bytes holds.
pub const fn capacity(size: u64) -> u64 {
    (size - ELEMS_OFF) / ELEM_SIZE
}

/// The most elements any leaf of `size` bytes can hold: every one a
/// compact entry. A bound for words read from media before the prefix
/// length is known; [`Layout::valid`] then checks against [`capacity_at`].
#[inline]
pub const fn max_count(size: u64) -> u64 {
    (size - ELEMS_OFF) / COMPACT_SIZE
}

/// Elements a leaf of `size` bytes holds when its prefix has `compact`
/// entries: those, and as many full elements as fit after them. Each
/// compact entry takes half a full element's bytes, so a leaf built with a
/// prefix takes more appends before it is full than [`capacity`] (its
/// count with no prefix) says: a 1 KB leaf split into halves of 15 keys
/// takes 22 more instead of 15 (format 4; a format-3 leaf never held more
/// than [`capacity`]). 0 when the prefix alone would not fit.
#[inline]
pub const fn capacity_at(size: u64, compact: u64) -> u64 {
    if compact > size / COMPACT_SIZE {
        return 0;
    }
    let start = full_start(compact);
    if start > size {
        return 0;
    }
    compact + (size - start) / ELEM_SIZE
}

/// The header words of the leaf at an offset, by name: callers reach them
/// through these addresses, never by adding the `*_OFF` constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvLeaf(u64);

impl NvLeaf {
    /// The leaf that starts at `leaf`.
    #[inline]
    pub const fn at(leaf: u64) -> NvLeaf {
        NvLeaf(leaf)
    }
    /// Address of the element count.
    #[inline]
    pub const fn count_word(self) -> u64 {
        self.0 + COUNT_OFF
    }
    /// Address of the sibling pointer.
    #[inline]
    pub const fn next_word(self) -> u64 {
        self.0 + NEXT_OFF
    }
    /// Address of the node size.
    #[inline]
    pub const fn size_word(self) -> u64 {
        self.0 + SIZE_OFF
    }
    /// Address of the incarnation stamp.
    #[inline]
    pub const fn stamp_word(self) -> u64 {
        self.0 + STAMP_OFF
    }
    /// The incarnation stamp: nonzero when the leaf is sealed.
    #[inline]
    pub fn stamp<S: Space>(self, s: &S) -> u64 {
        s.read_u64(self.stamp_word())
    }
}

/// The header line of a leaf being built whole (split, replace, merge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub count: u64,
    pub next: u64,
    pub size: u64,
    pub compact: u64,
    pub compact_version: u64,
    pub stamp: u64,
}

/// An image of a leaf being built in DRAM, written to the pool in one
/// piece once complete: word stores at the format's offsets.
pub struct LeafImage(Vec<u8>);

impl LeafImage {
    /// A zeroed image of the leaf's first `used` bytes.
    pub fn zeroed(used: u64) -> LeafImage {
        LeafImage(vec![0u8; used as usize])
    }
    fn put(&mut self, off: u64, w: u64) {
        self.0[off as usize..][..8].copy_from_slice(&w.to_le_bytes());
    }
    /// Writes the header line.
    pub fn write_head(&mut self, h: &Head) {
        self.put(COUNT_OFF, h.count);
        self.put(NEXT_OFF, h.next);
        self.put(SIZE_OFF, h.size);
        self.put(COMPACT_OFF, h.compact);
        self.put(COMPACT_VERSION_OFF, h.compact_version);
        self.put(STAMP_OFF, h.stamp);
    }
    /// Writes compact entry `j`: its key word and value word.
    pub fn write_compact(&mut self, j: u64, key_word: u64, value_word: u64) {
        let o = ELEMS_OFF + j * COMPACT_SIZE;
        self.put(o + C_KEY_WORD, key_word);
        self.put(o + C_VALUE_WORD, value_word);
    }
    /// Writes the words of the full element at byte offset `at` of the
    /// leaf (from [`full_start`]).
    pub fn write_full(&mut self, at: u64, words: &[u64; 4]) {
        for (k, w) in words.iter().enumerate() {
            self.put(at + k as u64 * 8, *w);
        }
    }
    /// The bytes to write at the leaf's offset.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
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
    /// Deletion bits of elements (`gone` in the module docs).
    pub gone: [u64; 2],
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
            gone: [s.read_u64(leaf + GONE_OFF), s.read_u64(leaf + GONE_OFF + 8)],
        }
    }

    /// Whether the prefix fits a leaf of `size` bytes holding `count`
    /// elements (for recovery and `check`: words read from a damaged pool).
    pub fn valid(&self, size: u64, count: u64) -> bool {
        self.compact <= count
            && count <= capacity_at(size, self.compact)
            && (self.compact == 0 || self.compact_version <= VERSION_MASK)
    }

    /// Whether no deletion bit names an element at or past `count` (the
    /// leaf's valid elements: a sealed leaf's count word lags behind them).
    pub fn gone_ok(&self, count: u64) -> bool {
        self.gone == self.gone_below(count)
    }

    /// The deletion bits of elements below `count` only.
    pub fn gone_below(&self, count: u64) -> [u64; 2] {
        let below = |from: u64| -> u64 {
            match count.saturating_sub(from) {
                0 => 0,
                n if n >= 64 => u64::MAX,
                n => (1 << n) - 1,
            }
        };
        [self.gone[0] & below(0), self.gone[1] & below(64)]
    }

    /// Whether element `i` was deleted in place.
    #[inline]
    pub fn is_gone(&self, i: u64) -> bool {
        i < GONE_SLOTS && self.gone[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Address of the word holding element `i`'s deletion bit
    /// (`i < GONE_SLOTS`).
    #[inline]
    pub fn gone_word(&self, i: u64) -> u64 {
        debug_assert!(i < GONE_SLOTS);
        self.leaf + GONE_OFF + (i / 64) * 8
    }

    /// Offset of full element `i` (`i >= compact`).
    #[inline]
    pub fn elem(&self, i: u64) -> u64 {
        debug_assert!(i >= self.compact);
        self.leaf + full_start(self.compact) + (i - self.compact) * ELEM_SIZE
    }

    /// The key word of element `i`.
    #[inline]
    /// Offset of compact entry `i`'s value word (`i < compact`).
    pub fn compact_value_word(&self, i: u64) -> u64 {
        debug_assert!(i < self.compact);
        self.leaf + ELEMS_OFF + i * COMPACT_SIZE + C_VALUE_WORD
    }

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
                compact_meta(self.compact_version) | if self.is_gone(i) { NEGATIVE } else { 0 },
            ]
        } else {
            let w = unseal(self.stored(s, i));
            [w[0], w[1], w[2], w[3] | if self.is_gone(i) { NEGATIVE } else { 0 }]
        }
    }

    /// Full element `i` as stored (with its check bits).
    #[inline]
    pub fn stored<S: Space>(&self, s: &S, i: u64) -> [u64; 4] {
        let e = self.elem(i);
        [
            s.read_u64(e + E_KEY_WORD),
            s.read_u64(e + E_BLOB),
            s.read_u64(e + E_VALUE_WORD),
            s.read_u64(e + E_META),
        ]
    }

    /// The chain input of full element `i`: the stored blob and meta words
    /// of the element before it (zero for the first full element).
    #[inline]
    pub fn chain<S: Space>(&self, s: &S, i: u64) -> [u64; 2] {
        if i <= self.compact {
            [0, 0]
        } else {
            let e = self.elem(i - 1);
            [s.read_u64(e + E_BLOB), s.read_u64(e + E_META)]
        }
    }
}

/// Where a sealed element's check goes: which leaf, its stamp, its slot
/// and the chain input ([`Layout::chain`]).
#[derive(Clone, Copy, Debug)]
pub struct SealAt {
    pub leaf: u64,
    pub stamp: u64,
    pub slot: u64,
    pub chain: [u64; 2],
}

/// The element words without check bits and CONT.
#[inline]
pub fn unseal(w: [u64; 4]) -> [u64; 4] {
    [w[0], w[1] & BLOB_MASK, w[2], w[3] & META_MASK]
}

#[inline]
fn mix(h: u64, w: u64) -> u64 {
    let x = (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// The check of clean words `w` (with CONT already in `w[3]` when set) at `at`.
#[inline]
fn check(w: &[u64; 4], at: &SealAt) -> u64 {
    let mut h = mix(at.stamp, at.leaf ^ at.slot.rotate_left(40));
    for x in [w[0], w[1], w[2], w[3], at.chain[0], at.chain[1]] {
        h = mix(h, x);
    }
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h ^ (h >> 31)) & ((1 << CHECK_BITS) - 1)
}

/// Seals clean element words for slot `at` of a sealed leaf: spreads the
/// check into the spare bits and sets CONT when `cont`.
#[inline]
pub fn seal(w: [u64; 4], cont: bool, at: &SealAt) -> [u64; 4] {
    let mut w = unseal(w);
    if cont {
        w[3] |= CONT;
    }
    let c = check(&w, at);
    let blob_bits = (c & 0x3f) | ((c >> 6) & 0xff_ffff) << 40;
    let meta_bits = ((c >> 30) & 0b11) << 60 | ((c >> 32) & 0b111) << 49;
    [w[0], w[1] | blob_bits, w[2], w[3] | meta_bits]
}

/// Whether stored words are a complete element sealed for `at`.
#[inline]
pub fn sealed_ok(stored: [u64; 4], at: &SealAt) -> bool {
    seal(stored, stored[3] & CONT != 0, at) == stored
}

/// A meta word that makes the element stored at `at` fail its check for
/// certain: its own meta word with every meta check bit inverted. Storing
/// it is one failure-atomic 8-byte store (recovery's undo of a transaction:
/// a crash leaves the element either valid or invalid, never torn), and
/// storing it again changes nothing (the check bits are computed from the
/// other bits, which stay). The elements chained after it change their
/// chain input, so they fail their checks too.
pub fn spoiled_meta(stored: [u64; 4], at: &SealAt) -> u64 {
    seal(stored, stored[3] & CONT != 0, at)[3] ^ META_CHECK
}

/// A sealed leaf's end after a crash: the longest prefix of complete,
/// valid append groups among its full elements, from `compact` up to its
/// capacity. Its count word plays no part (written when the leaf is built
/// and at clean shutdown only, so after a crash it is behind the appends).
pub fn valid_end<S: Space>(s: &S, layout: &Layout, stamp: u64, capacity: u64) -> u64 {
    let mut end = layout.compact;
    let mut i = end;
    while i < capacity {
        let stored = layout.stored(s, i);
        let at = SealAt {
            leaf: layout.leaf,
            stamp,
            slot: i,
            chain: layout.chain(s, i),
        };
        if !sealed_ok(stored, &at) {
            break;
        }
        i += 1;
        if stored[3] & CONT == 0 {
            end = i;
        }
    }
    end
}

/// A fresh stamp for a leaf built where `old` was the stamp word: nonzero
/// and different from `old`, so no stale element of the chunk's earlier
/// life validates (its checks used another stamp, or another offset).
pub fn fresh_stamp(leaf: u64, old: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0x243F_6A88_85A3_08D3);
    let n = NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mut z = n ^ old.rotate_left(17) ^ leaf;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    if z == 0 || z == old {
        z = old.wrapping_add(1).max(1);
    }
    z
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
    fn a_spoiled_meta_word_fails_the_check_and_spoils_the_chain() {
        let meta = Meta {
            negative: false,
            key_inline: Some(8),
            value_inline: Some(8),
            txn: true,
            version: 5,
        }
        .encode();
        let words = [key_word(b"abcdefgh"), 0, 42, meta];
        for cont in [false, true] {
            let at = SealAt {
                leaf: 4096,
                stamp: 0x1234_5678,
                slot: 3,
                chain: [0, 7],
            };
            let good = seal(words, cont, &at);
            assert!(sealed_ok(good, &at));
            let bad = spoiled_meta(good, &at);
            let spoiled = [good[0], good[1], good[2], bad];
            assert!(!sealed_ok(spoiled, &at));
            assert_eq!(spoiled_meta(spoiled, &at), bad, "spoiling twice stores the same word");
            assert_eq!(unseal(spoiled), unseal(good), "only check bits change");
            // The next element was sealed with the good words as its chain.
            let next_at = SealAt {
                slot: 4,
                chain: [good[1], good[3]],
                ..at
            };
            let next = seal([key_word(b"abcdefgi"), 0, 43, meta], false, &next_at);
            assert!(sealed_ok(next, &next_at));
            let after_spoil = SealAt {
                chain: [spoiled[1], spoiled[3]],
                ..next_at
            };
            assert!(!sealed_ok(next, &after_spoil));
        }
    }

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
    fn a_sealed_element_validates_only_where_it_was_sealed() {
        let meta = Meta {
            negative: false,
            key_inline: Some(8),
            value_inline: None,
            txn: true,
            version: VERSION_MASK,
        }
        .encode();
        let w = [0x0123_4567_89ab_cdef, (1 << 40) - 64, u64::MAX, meta];
        let at = SealAt {
            leaf: 4096,
            stamp: 77,
            slot: 5,
            chain: [3, 4],
        };
        for cont in [false, true] {
            let sealed = seal(w, cont, &at);
            assert!(sealed_ok(sealed, &at));
            assert_eq!(sealed[3] & CONT != 0, cont);
            // The clean words come back, and decode.
            let clean = unseal(sealed);
            assert_eq!(clean, w);
            assert!(Meta::decode(clean[3]).is_some());
            // Anywhere else, or any word torn, it fails its check.
            for other in [
                SealAt { leaf: 8192, ..at },
                SealAt { stamp: 78, ..at },
                SealAt { slot: 6, ..at },
                SealAt { chain: [3, 5], ..at },
            ] {
                assert!(!sealed_ok(sealed, &other), "{other:?}");
            }
            for k in 0..4 {
                let mut torn = sealed;
                torn[k] ^= 1 << 20;
                assert!(!sealed_ok(torn, &at), "word {k}");
                torn[k] = 0;
                assert!(!sealed_ok(torn, &at) || sealed[k] == 0, "word {k} zero");
            }
        }
        assert!(!sealed_ok([0; 4], &at));
        // Check bits: as many as promised, in bits no writer uses.
        assert_eq!(BLOB_MASK.count_zeros() + (META_MASK | CONT).count_zeros(), CHECK_BITS);
        assert_ne!(fresh_stamp(4096, 5), 5);
        assert_ne!(fresh_stamp(4096, 0), 0);
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
            // Format 4: the bytes the prefix saves hold more full elements,
            // never past the leaf's end.
            for compact in 0..=(size - ELEMS_OFF) / COMPACT_SIZE {
                let at = capacity_at(size, compact);
                assert!(at >= cap.max(compact), "size {size}, compact {compact}");
                assert!(full_start(compact) + (at - compact) * ELEM_SIZE <= size);
                assert!(full_start(compact) + (at - compact + 1) * ELEM_SIZE > size);
            }
            assert_eq!(capacity_at(size, u64::MAX), 0);
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
