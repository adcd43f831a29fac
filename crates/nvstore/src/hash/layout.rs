//! On-pool layout of the hash table (see `mod.rs` for the picture).
//!
//! Everything here is a pure function of bytes: the hash, bucket and slot
//! offsets, and the encoding of one slot's four words. The hash is part of
//! the format (it decides where a key lives), so it is defined here, not
//! taken from a crate whose algorithm may change between versions.

/// Slots per bucket: a header word plus 7 slots of 32 bytes fill 232 of a
/// bucket's 256 bytes.
pub const BUCKET_SLOTS: usize = 7;
pub const SLOT_BYTES: u64 = 32;
pub const BUCKET_BYTES: u64 = 256;
/// Buckets per segment (a power of two).
pub const SEGMENT_BUCKETS: u64 = 16;
pub const SEGMENT_BYTES: u64 = SEGMENT_BUCKETS * BUCKET_BYTES;
/// A key lives in its home bucket or the next one (linear probing within
/// the segment, wrapping), as in CCEH's bounded probing.
pub const PROBE: u64 = 2;
/// Deepest local or global depth accepted (a directory of 2^24 words is far
/// beyond any pool this engine runs on).
pub const MAX_DEPTH: u32 = 24;

/// Directory word 0: `depth | tag << 32`. The tag names the table's
/// [`KeyHash`], and catches a root that points at bytes that were never a
/// directory.
pub const DIR_TAG: u64 = 0x4853_4449; // "IDSH": FNV-1a
pub const DIR_TAG_XXH3: u64 = 0x5853_4449; // "IDSX": XXH3

/// The hash a table places its keys by. It is part of the format (it
/// decides where a key lives and is kept in the slots of keys out of
/// line), so each table records its own in its directory's tag, and a
/// table keeps the hash it was created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyHash {
    /// [`fnv1a`]: the hash of the tables created before XXH3 replaced it.
    Fnv1a,
    /// XXH3-64 with seed 0 (its output fixed by the XXH3 specification):
    /// the hash of new tables. It reads 8 to 16 bytes a step where FNV-1a
    /// reads one, so a 40-byte key hashes in a fraction of the time.
    Xxh3,
}

impl KeyHash {
    /// The hash a new table uses.
    pub const NEW: KeyHash = KeyHash::Xxh3;

    #[inline]
    pub fn of(self, key: &[u8]) -> u64 {
        match self {
            KeyHash::Fnv1a => fnv1a(key),
            KeyHash::Xxh3 => xxhash_rust::xxh3::xxh3_64(key),
        }
    }

    fn tag(self) -> u64 {
        match self {
            KeyHash::Fnv1a => DIR_TAG,
            KeyHash::Xxh3 => DIR_TAG_XXH3,
        }
    }

    /// The hash a directory's first word names, if it names one.
    pub fn from_word0(w0: u64) -> Option<KeyHash> {
        match w0 >> 32 {
            DIR_TAG => Some(KeyHash::Fnv1a),
            DIR_TAG_XXH3 => Some(KeyHash::Xxh3),
            _ => None,
        }
    }

    /// The name `stat` shows.
    pub fn name(self) -> &'static str {
        match self {
            KeyHash::Fnv1a => "fnv1a",
            KeyHash::Xxh3 => "xxh3",
        }
    }
}

/// Bytes of a directory of global depth `depth`.
pub fn dir_bytes(depth: u32) -> u64 {
    8 + 8 * (1u64 << depth)
}

pub fn dir_word0(depth: u32, key_hash: KeyHash) -> u64 {
    depth as u64 | (key_hash.tag() << 32)
}

/// A directory entry: segment offset (64-byte aligned) with the segment's
/// local depth in the low 6 bits.
pub fn dir_entry(seg: u64, local: u32) -> u64 {
    debug_assert!(seg.is_multiple_of(64) && local < 64);
    seg | local as u64
}

pub fn entry_seg(e: u64) -> u64 {
    e & !63
}

pub fn entry_depth(e: u64) -> u32 {
    (e & 63) as u32
}

/// FNV-1a over the bytes, then the MurmurHash3 finaliser so every output
/// bit depends on every input bit (the directory uses the top bits, the
/// bucket the low bits, the fingerprint the bits above those): the hash
/// of tables tagged [`DIR_TAG`] ([`KeyHash::Fnv1a`]).
pub fn fnv1a(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= key.len() as u64;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Directory index of `h` in a directory of global depth `depth` (its top bits).
pub fn dir_index(h: u64, depth: u32) -> u64 {
    if depth == 0 {
        0
    } else {
        h >> (64 - depth)
    }
}

/// Bit of `h` that separates the two halves of a segment of local depth `local`.
pub fn split_bit(h: u64, local: u32) -> u64 {
    (h >> (63 - local)) & 1
}

pub fn home_bucket(h: u64) -> u64 {
    h & (SEGMENT_BUCKETS - 1)
}

pub fn fingerprint(h: u64) -> u8 {
    (h >> 8) as u8
}

/// Offset of bucket `b` in the segment at `seg`.
pub fn bucket_off(seg: u64, b: u64) -> u64 {
    seg + (b % SEGMENT_BUCKETS) * BUCKET_BYTES
}

/// Offset of slot `i` from the start of its bucket.
pub fn slot_rel(i: usize) -> u64 {
    8 + SLOT_BYTES * i as u64
}

/// Bucket header word: bit `i` (i < 7) says slot `i` holds a published
/// entry; byte `i + 1` is that slot's fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketHeader(pub u64);

impl BucketHeader {
    pub fn valid(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    pub fn fp(self, i: usize) -> u8 {
        (self.0 >> (8 + 8 * i)) as u8
    }

    pub fn with(self, i: usize, fp: u8) -> BucketHeader {
        let cleared = self.0 & !(0xff << (8 + 8 * i));
        BucketHeader(cleared | (1 << i) | ((fp as u64) << (8 + 8 * i)))
    }

    pub fn without(self, i: usize) -> BucketHeader {
        BucketHeader(self.0 & !(1 << i))
    }

    pub fn free_slot(self) -> Option<usize> {
        (0..BUCKET_SLOTS).find(|&i| !self.valid(i))
    }

    /// No bit above the slot bitmap is set in the low byte.
    pub fn well_formed(self) -> bool {
        self.0 & 0x80 == 0
    }
}

/// Inline bytes up to this length live in the slot; longer ones in a blob.
pub const INLINE_MAX: usize = 8;
const OUT_OF_LINE: u64 = 15;
const VALID: u64 = 1 << 63;
const VERSION_BITS: u32 = 48;
pub const VERSION_MAX: u64 = (1 << VERSION_BITS) - 1;

/// One slot: `[key_word, blob, value_word, meta]`.
///
/// `key_word` is the key's bytes when it is inline, else the key's
/// [`hash`] (0 in slots written before it was kept there, and read back by
/// rehashing the blob's key): a segment split rehashes every entry, and
/// with the hash in the slot it need not read each key out of its blob.
/// Recovery checks it against the key.
/// `meta = VALID | key_code | value_code << 4 | version << 8`, where a code
/// of 0..=8 is an inline length and 15 means "in the blob". `VALID` makes
/// an all-zero slot (never written, or lost) decode as invalid.
pub type Slot = [u64; 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub key_inline: Option<u8>,
    pub value_inline: Option<u8>,
    pub version: u64,
}

impl Meta {
    pub fn encode(self) -> u64 {
        let code = |c: Option<u8>| c.map_or(OUT_OF_LINE, |l| l as u64);
        VALID | code(self.key_inline) | code(self.value_inline) << 4 | self.version << 8
    }

    pub fn decode(w: u64) -> Option<Meta> {
        if w & VALID == 0 || (w >> (8 + VERSION_BITS)) & 0x7f != 0 {
            return None;
        }
        let code = |c: u64| match c {
            0..=8 => Some(Some(c as u8)),
            OUT_OF_LINE => Some(None),
            _ => None,
        };
        let version = (w >> 8) & VERSION_MAX;
        (version > 0).then_some(())?;
        Some(Meta {
            key_inline: code(w & 15)?,
            value_inline: code((w >> 4) & 15)?,
            version,
        })
    }

    pub fn needs_blob(self) -> bool {
        self.key_inline.is_none() || self.value_inline.is_none()
    }
}

fn inline_word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// Encodes a slot for `key`/`value`; `blob_off` is 0 when both are inline.
/// `key_hash` is the table's hash of `key` ([`KeyHash::of`]), which every
/// writer has computed to find the bucket: a slot keeps it for a key out
/// of line, and hashing the key again here cost a put as much as its
/// first hash.
pub fn encode_slot(key: &[u8], value: &[u8], blob_off: u64, version: u64, key_hash: u64) -> Slot {
    let inline = |b: &[u8]| (b.len() <= INLINE_MAX).then_some(b.len() as u8);
    let meta = Meta {
        key_inline: inline(key),
        value_inline: inline(value),
        version,
    };
    let kw = if key.len() <= INLINE_MAX {
        inline_word(key)
    } else {
        key_hash
    };
    let vw = if value.len() <= INLINE_MAX {
        inline_word(value)
    } else {
        0
    };
    [kw, blob_off, vw, meta.encode()]
}

/// The parts of `key`/`value` a blob holds (those that are not inline),
/// in the layout of `format/blob.rs`; `None` when both are inline.
pub fn blob_parts<'a>(key: &'a [u8], value: &'a [u8]) -> Option<(&'a [u8], &'a [u8])> {
    let k: &[u8] = if key.len() > INLINE_MAX { key } else { &[] };
    let v: &[u8] = if value.len() > INLINE_MAX { value } else { &[] };
    (!k.is_empty() || !v.is_empty()).then_some((k, v))
}

pub fn slot_from_bytes(b: &[u8]) -> Slot {
    let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    [w(0), w(1), w(2), w(3)]
}

pub fn slot_to_bytes(s: &Slot) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, w) in s.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_zero_is_invalid() {
        for (k, v, ver) in [(Some(0), Some(8), 1), (None, Some(3), VERSION_MAX), (Some(5), None, 77)] {
            let m = Meta {
                key_inline: k,
                value_inline: v,
                version: ver,
            };
            assert_eq!(Meta::decode(m.encode()), Some(m));
        }
        assert_eq!(Meta::decode(0), None);
        assert_eq!(Meta::decode(VALID), None, "version 0 is never written");
        assert_eq!(Meta::decode(VALID | 9 | 1 << 8), None, "length code 9 is invalid");
    }

    #[test]
    fn bucket_header_sets_and_clears_one_slot() {
        let h = BucketHeader::default().with(3, 0xab).with(0, 1);
        assert!(h.valid(3) && h.valid(0) && !h.valid(1));
        assert_eq!((h.fp(3), h.fp(0)), (0xab, 1));
        assert_eq!(h.free_slot(), Some(1));
        let h = h.without(3);
        assert!(!h.valid(3) && h.valid(0));
        let full = (0..BUCKET_SLOTS).fold(BucketHeader::default(), |h, i| h.with(i, 0));
        assert_eq!(full.free_slot(), None);
        assert!(full.well_formed());
    }

    #[test]
    fn hashes_are_stable() {
        // The hashes are part of the format: these values must never change.
        assert_eq!(fnv1a(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(fnv1a(b"nvstore"), 0x7ecc_6a59_9d26_2077);
        assert_eq!(KeyHash::Fnv1a.of(b"nvstore"), fnv1a(b"nvstore"));
        // XXH3-64, seed 0, of the empty input (the specification's value).
        assert_eq!(KeyHash::Xxh3.of(b""), 0x2d06_8005_38d3_94c2);
        for kh in [KeyHash::Fnv1a, KeyHash::Xxh3] {
            assert_ne!(kh.of(b"a"), kh.of(b"b"));
            assert_ne!(kh.of(b"\0"), kh.of(b""));
            let spread: std::collections::BTreeSet<u64> =
                (0u32..64).map(|i| dir_index(kh.of(&i.to_le_bytes()), 2)).collect();
            assert_eq!(spread.len(), 4, "{kh:?}: top bits spread over the directory");
            assert_eq!(KeyHash::from_word0(dir_word0(7, kh)), Some(kh));
        }
        assert_eq!(KeyHash::from_word0(7 | 0x1234 << 32), None);
    }
}
