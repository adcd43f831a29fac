//! Isle leaf node (Isle-Tree §IV): cache lines sorted inside, the node not.
//!
//! ```text
//! header (H lines: 1 up to 2624-byte leaves, 2 up to 6784 bytes, ...):
//!   { u64 next (| STALE) | u64 size | u64 low | u8 code[D] }   D = size/64 - H data lines
//! data line ξ, kind C (compact, 4 slots of 16 bytes):
//!   { u64 key_word[4] | u64 value_word[4] }   slot j: key_word[j], value_word[j]
//! data line ξ, kind G (general, 2 slots of 32 bytes, laid out as an nv element):
//!   { u64 key_word | u64 blob | u64 value_word | u64 meta } [2]
//! ```
//!
//! - `code[ξ]`, one byte per data line in the header (the paper's per-line
//!   counter), names the line's kind and its live slots *in key order*: code
//!   0 is an empty line, codes 1..=64 every ordered selection of 1 to 4 of
//!   the 4 compact slots, codes 65..=68 every ordered selection of 1 or 2 of
//!   the 2 general slots. Reading a line in its code's order reads it sorted,
//!   so a search leaves a line at its first larger key (the paper's hops).
//! - A compact slot holds a key of exactly 8 bytes and a value of exactly 8
//!   bytes (the papers' benchmark pair: four to a line). Every other pair
//!   (shorter or longer keys or values, out-of-line bytes in a blob) takes
//!   a general slot, encoded exactly as an nv element with version 0.
//! - Insert (the paper's Algorithm 1, made safe under 8-byte failure
//!   atomicity): pick a line of the right kind with a free slot (or an empty
//!   line), write the pair into the free slot, flush and fence that line;
//!   then store the 8-byte header word holding the line's code with the new
//!   slot ranked in, flush and fence it. One data line and one header line
//!   per insert. A live slot is never written, so no crash state has a torn
//!   or duplicated pair: the paper's four inconsistent-line cases (§IV-F)
//!   cannot arise, and recovery repairs nothing in a line.
//! - Update of a compact pair: one atomic store of its value word, flushed
//!   and fenced (the paper's update). Any other update writes the new pair
//!   into a free slot (in the old pair's line when it has one) and switches
//!   codes: one word store when both lines' codes share a header word, else
//!   the new line's word first, then the old one's. A crash between the two
//!   leaves the key live twice; the general copy with the newer version wins
//!   (recovery drops the other, a read-only open skips it).
//! - Delete: one header-word store drops the slot from its line's code.
//! - Replace and merge build new leaves (only the used lines and the header
//!   are written and flushed; codes say the rest is empty) and swap one
//!   sibling pointer, as for nv.
//! - Split keeps the left half where it is: the upper half goes to a new
//!   leaf R (`low` = the first key word of R, which must exceed every key
//!   word left behind), then one store links `next = R | STALE`, then the
//!   codes drop the moved pairs. STALE says: my pairs whose key word is at
//!   least my successor's `low` are dead (moved on); recovery drops them
//!   when a crash came between the link and the codes. A leaf that
//!   replaces R inherits R's `low`, so the bound never changes under a
//!   STALE link. A split thus copies half a leaf instead of all of it.

use crate::pmem::LINE;

pub const NEXT_OFF: u64 = 0;
pub const SIZE_OFF: u64 = 8;
pub const LOW_OFF: u64 = 16;
pub const CODES_OFF: u64 = 24;

/// Flag in `next`: pairs at or above the successor's `low` are dead.
pub const STALE: u64 = 1;

/// Slots of a compact line, and of a general line.
pub const C_SLOTS: usize = 4;
pub const G_SLOTS: usize = 2;

/// Smallest leaf: a header line and two data lines.
pub const MIN_SIZE: u64 = 3 * LINE;

/// What a line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Empty,
    Compact,
    General,
}

/// One decoded code: the line's kind and its live slots in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code {
    pub kind: Kind,
    pub len: u8,
    pub order: [u8; 4],
}

impl Code {
    pub const EMPTY: Code = Code {
        kind: Kind::Empty,
        len: 0,
        order: [0; 4],
    };
    /// Live slots in key order.
    #[inline]
    pub fn live(&self) -> &[u8] {
        &self.order[..self.len as usize]
    }
    /// Slots of the line's kind.
    pub fn slots(&self) -> usize {
        match self.kind {
            Kind::Empty => 0,
            Kind::Compact => C_SLOTS,
            Kind::General => G_SLOTS,
        }
    }
    /// A free slot, if the line has one.
    pub fn free_slot(&self) -> Option<u8> {
        (0..self.slots() as u8).find(|s| !self.live().contains(s))
    }
    /// The code of `kind` listing `order`; `None` if no code does.
    pub fn encode(kind: Kind, order: &[u8]) -> Option<u8> {
        if order.is_empty() {
            return Some(0);
        }
        (1..=LAST_CODE).find(|&c| {
            let d = decode(c);
            d.kind == kind && d.live() == order
        })
    }
}

/// Highest code in use.
pub const LAST_CODE: u8 = 68;

const TABLE: [Code; 256] = build_table();

const fn build_table() -> [Code; 256] {
    let invalid = Code {
        kind: Kind::Empty,
        len: u8::MAX,
        order: [0; 4],
    };
    let mut t = [invalid; 256];
    t[0] = Code::EMPTY;
    let mut next = 1usize;
    let mut kind = 0;
    while kind < 2 {
        let (k, slots) = if kind == 0 {
            (Kind::Compact, C_SLOTS)
        } else {
            (Kind::General, G_SLOTS)
        };
        let mut len = 1;
        while len <= slots {
            // Every sequence of `len` slots, in lexicographic order; keep those without repeats.
            let mut total = 1;
            let mut i = 0;
            while i < len {
                total *= slots;
                i += 1;
            }
            let mut n = 0;
            while n < total {
                let mut order = [0u8; 4];
                let mut rest = n;
                let mut j = len;
                while j > 0 {
                    j -= 1;
                    order[j] = (rest % slots) as u8;
                    rest /= slots;
                }
                let mut distinct = true;
                let mut a = 0;
                while a < len {
                    let mut b = a + 1;
                    while b < len {
                        if order[a] == order[b] {
                            distinct = false;
                        }
                        b += 1;
                    }
                    a += 1;
                }
                if distinct {
                    t[next] = Code {
                        kind: k,
                        len: len as u8,
                        order,
                    };
                    next += 1;
                }
                n += 1;
            }
            len += 1;
        }
        kind += 1;
    }
    assert!(next == LAST_CODE as usize + 1);
    t
}

/// Decodes a code byte; an unused byte decodes with `len == u8::MAX`.
#[inline]
pub const fn decode(code: u8) -> Code {
    TABLE[code as usize]
}

/// Whether `code` is one a writer produces.
pub const fn valid(code: u8) -> bool {
    code <= LAST_CODE
}

/// Header lines of a leaf of `size` bytes: the fewest `h` whose bytes
/// hold the fixed words and one code per data line, that is
/// `CODES_OFF + (lines - h) <= h * LINE`. Computed in one step, so a
/// damaged `size` word costs no time.
pub const fn header_lines(size: u64) -> u64 {
    let lines = size / LINE;
    (CODES_OFF + lines).div_ceil(LINE + 1)
}

/// Data lines of a leaf of `size` bytes (0 for a size too small to be a
/// leaf's).
pub const fn data_lines(size: u64) -> u64 {
    (size / LINE).saturating_sub(header_lines(size))
}

/// Pairs a leaf of `size` bytes holds at most (every line compact).
pub const fn capacity(size: u64) -> u64 {
    data_lines(size) * C_SLOTS as u64
}

/// The header words of the leaf at an offset, by name: callers reach them
/// through these addresses, never by adding the `*_OFF` constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsleLeaf(u64);

impl IsleLeaf {
    /// The leaf that starts at `leaf`.
    #[inline]
    pub const fn at(leaf: u64) -> IsleLeaf {
        IsleLeaf(leaf)
    }
    /// Address of the sibling pointer (with its STALE flag).
    #[inline]
    pub const fn next_word(self) -> u64 {
        self.0 + NEXT_OFF
    }
    /// Address of the node size.
    #[inline]
    pub const fn size_word(self) -> u64 {
        self.0 + SIZE_OFF
    }
    /// Address of the lowest key word the leaf may hold.
    #[inline]
    pub const fn low_word(self) -> u64 {
        self.0 + LOW_OFF
    }
}

/// Writes the header words of a leaf being built in DRAM (`buf` holds the
/// leaf from its first byte): sibling pointer, size and `low`.
pub fn write_meta(buf: &mut [u8], next: u64, size: u64, low: u64) {
    for (off, w) in [(NEXT_OFF, next), (SIZE_OFF, size), (LOW_OFF, low)] {
        buf[off as usize..][..8].copy_from_slice(&w.to_le_bytes());
    }
}

/// Sets the code byte of data line `line` in a leaf being built in DRAM.
pub fn write_code(buf: &mut [u8], line: u64, code: u8) {
    buf[(CODES_OFF + line) as usize] = code;
}

/// Offset of data line `line`.
#[inline]
pub const fn line(leaf: u64, size: u64, line: u64) -> u64 {
    leaf + (header_lines(size) + line) * LINE
}

/// Offset of the code byte of data line `line`.
#[inline]
pub const fn code_off(leaf: u64, line: u64) -> u64 {
    leaf + CODES_OFF + line
}

/// Offset of the 8-byte header word holding the code of `line`.
#[inline]
pub const fn code_word(leaf: u64, line: u64) -> u64 {
    code_off(leaf, line) & !7
}

/// Byte position of `line`'s code inside its header word.
#[inline]
pub const fn code_shift(leaf: u64, line: u64) -> u32 {
    ((code_off(leaf, line) & 7) * 8) as u32
}

/// Compact slot words: key then value.
#[inline]
pub const fn c_key(line_off: u64, slot: u8) -> u64 {
    line_off + slot as u64 * 8
}
#[inline]
pub const fn c_value(line_off: u64, slot: u8) -> u64 {
    line_off + 32 + slot as u64 * 8
}

/// General slot: the element's first word.
#[inline]
pub const fn g_elem(line_off: u64, slot: u8) -> u64 {
    line_off + slot as u64 * 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_decodes_and_encodes_back() {
        let mut seen = std::collections::HashSet::new();
        for c in 0..=LAST_CODE {
            let d = decode(c);
            assert!(d.len as usize <= 4);
            assert_eq!(Code::encode(d.kind, d.live()), Some(c), "code {c}");
            assert!(seen.insert((d.kind as u8, d.live().to_vec())));
        }
        for c in LAST_CODE + 1..=255 {
            assert_eq!(decode(c).len, u8::MAX);
            assert!(!valid(c));
        }
        // 4 + 12 + 24 + 24 compact selections, 2 + 2 general ones.
        let compact = (1..=LAST_CODE).filter(|&c| decode(c).kind == Kind::Compact).count();
        assert_eq!(compact, 64);
        assert_eq!(
            Code::encode(Kind::Compact, &[3, 1, 0]).map(|c| decode(c).live().to_vec()),
            Some(vec![3, 1, 0])
        );
        assert_eq!(Code::encode(Kind::General, &[0, 0]), None);
    }

    #[test]
    fn geometry() {
        assert_eq!(header_lines(1024), 1);
        assert_eq!(data_lines(1024), 15);
        assert_eq!(capacity(1024), 60);
        assert_eq!(header_lines(4096), 2);
        assert_eq!(data_lines(4096), 62);
        assert_eq!(header_lines(2624), 1);
        assert_eq!(header_lines(2688), 2);
        assert_eq!(header_lines(6784), 2);
        assert_eq!(header_lines(6848), 3);
        assert_eq!(header_lines(MIN_SIZE), 1);
        for size in (MIN_SIZE..=1 << 20).step_by(64) {
            let h = header_lines(size);
            assert!(h >= 1);
            assert!(CODES_OFF + data_lines(size) <= h * LINE);
            assert!(h == 1 || CODES_OFF + (size / LINE - (h - 1)) > (h - 1) * LINE);
        }
        // Sizes read from a damaged pool: no underflow, no long loop.
        assert_eq!(data_lines(0), 0);
        assert_eq!(data_lines(LINE), 0);
        assert_eq!(header_lines(u64::MAX), (CODES_OFF + u64::MAX / LINE).div_ceil(LINE + 1));
        assert!(data_lines(u64::MAX) < u64::MAX / LINE);
        // The codes of lines 0..8 share one header word, 8..16 the next.
        assert_eq!(code_word(0, 0), 24);
        assert_eq!(code_word(0, 7), 24);
        assert_eq!(code_word(0, 8), 32);
        assert_eq!(code_shift(0, 9), 8);
    }
}
