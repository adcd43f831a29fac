//! Validation of leaves and blobs read from media that may be damaged.
//!
//! A pool file comes from disks, backups and other machines, so every word
//! an offset or a length is derived from is checked against the format's
//! rules before it is followed. The engine runs these checks once per leaf
//! it reaches after opening a pool (leaves it writes itself are sound by
//! construction), so every later read of that leaf stays inside the pool
//! and inside its own structures. A failed check names the pool offset of
//! the damaged leaf, element or blob.

use crate::format::element::validate_blob;
use crate::format::header;
use crate::format::leaf_isle::{self as il, Kind};
use crate::format::leaf_nv::{self as nv, Layout, Meta};
use crate::pmem::{Space, LINE};

/// What is damaged and where: `off` is the pool offset of the leaf, the
/// element or the blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub off: u64,
    pub what: String,
}

impl Damage {
    fn at(off: u64, what: impl Into<String>) -> Damage {
        Damage { off, what: what.into() }
    }
}

pub type Checked<T = ()> = std::result::Result<T, Damage>;

/// Whether `off` can start a leaf of the smallest size in a pool of
/// `pool` bytes whose data area starts at `data_start`: aligned to a line,
/// inside the data area.
pub fn leaf_offset_ok(off: u64, data_start: u64, pool: u64) -> bool {
    off.is_multiple_of(LINE) && off >= data_start && off <= pool.saturating_sub(nv::MIN_SIZE)
}

/// A leaf's `size` word: at least `min`, a multiple of a line, inside the pool.
fn size_ok(off: u64, size: u64, min: u64, pool: u64) -> Checked {
    if size < min || !size.is_multiple_of(LINE) || size > pool.saturating_sub(off) {
        return Err(Damage::at(off, format!("leaf {off} has invalid size {size}")));
    }
    Ok(())
}

/// The chain link of the leaf at `off`: 0 (the end) or a leaf offset.
fn next_ok(off: u64, next: u64, data_start: u64, pool: u64) -> Checked {
    if next != 0 && (next == off || !leaf_offset_ok(next, data_start, pool)) {
        return Err(Damage::at(off, format!("leaf {off} links to invalid offset {next}")));
    }
    Ok(())
}

/// One element's words (as a full nv element): metadata a writer produces
/// and, where the element has one, a sound blob.
pub fn element_ok<S: Space>(s: &S, at: u64, words: &[u64; 4], pool: u64) -> Checked<Meta> {
    let meta = Meta::decode(words[3])
        .ok_or_else(|| Damage::at(at, format!("element {at} has invalid metadata {:#x}", words[3])))?;
    if meta.needs_blob() {
        validate_blob(s, words[1], meta, pool).map_err(|w| Damage::at(words[1], format!("element {at}: {w}")))?;
    } else if words[1] != 0 {
        return Err(Damage::at(
            at,
            format!("element {at} has a blob reference but inline data"),
        ));
    }
    Ok(meta)
}

/// Checks the nv leaf at `off`: size, count against capacity, the
/// compact prefix, the chain link and every element with its blob.
/// Returns the leaf's size and published count: the persistent count of an
/// unsealed leaf, the end of the valid elements of a sealed one.
pub fn nv_leaf<S: Space>(s: &S, off: u64, data_start: u64) -> Checked<(u64, u64)> {
    let pool = header::pool_size(s).min(s.size());
    if !leaf_offset_ok(off, data_start, pool) {
        return Err(Damage::at(off, format!("leaf offset {off} is outside the data area")));
    }
    let size = s.read_u64(off + nv::SIZE_OFF);
    size_ok(off, size, nv::MIN_SIZE, pool)?;
    let count = s.read_u64(off + nv::COUNT_OFF);
    if count > nv::max_count(size) {
        return Err(Damage::at(
            off,
            format!("leaf {off} count {count} exceeds capacity {}", nv::max_count(size)),
        ));
    }
    let layout = Layout::read(s, off);
    if !layout.valid(size, count) {
        return Err(Damage::at(
            off,
            format!(
                "leaf {off} has an invalid compact prefix ({} of {count})",
                layout.compact
            ),
        ));
    }
    next_ok(off, s.read_u64(off + nv::NEXT_OFF), data_start, pool)?;
    // A sealed leaf ends where its valid elements end: after a crash its
    // count word is behind (appends do not store it).
    let stamp = s.read_u64(off + nv::STAMP_OFF);
    let count = if stamp == 0 {
        count
    } else {
        nv::valid_end(s, &layout, stamp, nv::capacity_at(size, layout.compact))
    };
    if !layout.gone_ok(count) {
        return Err(Damage::at(
            off,
            format!("leaf {off} marks elements deleted past its {count} elements"),
        ));
    }
    for i in layout.compact..count {
        let at = layout.elem(i);
        element_ok(s, at, &layout.words(s, i), pool)?;
    }
    Ok((size, count))
}

/// Checks the isle leaf at `off`: size, the chain link (STALE flag
/// aside), every line code, and every general slot a code names with its
/// blob. Returns the leaf's size.
pub fn isle_leaf<S: Space>(s: &S, off: u64, data_start: u64) -> Checked<u64> {
    let pool = header::pool_size(s).min(s.size());
    if !leaf_offset_ok(off, data_start, pool) {
        return Err(Damage::at(off, format!("leaf offset {off} is outside the data area")));
    }
    let size = s.read_u64(off + il::SIZE_OFF);
    size_ok(off, size, il::MIN_SIZE, pool)?;
    next_ok(off, s.read_u64(off + il::NEXT_OFF) & !il::STALE, data_start, pool)?;
    for line in 0..il::data_lines(size) {
        let code = (s.load(il::code_word(off, line)) >> il::code_shift(off, line)) as u8;
        if !il::valid(code) {
            return Err(Damage::at(
                off,
                format!("leaf {off} line {line} has invalid code {code:#x}"),
            ));
        }
        let c = il::decode(code);
        if c.kind != Kind::General {
            continue;
        }
        let lo = il::line(off, size, line);
        for &slot in c.live() {
            let e = il::g_elem(lo, slot);
            let words = [s.load(e), s.load(e + 8), s.load(e + 16), s.load(e + 24)];
            let meta = element_ok(s, e, &words, pool)?;
            if meta.negative || meta.txn {
                return Err(Damage::at(e, format!("element {e} is NEGATIVE or TXN in an isle leaf")));
            }
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::blob;
    use crate::pmem::SimSpace;

    const DATA: u64 = 4096;

    fn space() -> SimSpace {
        let s = SimSpace::new(64 * 1024);
        s.store(header::POOL_SIZE_OFF, 64 * 1024);
        s
    }

    /// An nv leaf at `off` with one inline element and one blob element.
    fn nv_leaf_with_blob(s: &SimSpace, off: u64, blob_at: u64) {
        s.store(off + nv::SIZE_OFF, 1024);
        s.store(off + nv::COUNT_OFF, 2);
        let inline = Meta {
            negative: false,
            key_inline: Some(3),
            value_inline: Some(2),
            txn: false,
            version: 1,
        };
        let e0 = off + nv::ELEMS_OFF;
        s.store(e0 + nv::E_KEY_WORD, nv::key_word(b"abc"));
        s.store(e0 + nv::E_META, inline.encode());
        let long = Meta {
            value_inline: None,
            ..inline
        };
        let e1 = e0 + nv::ELEM_SIZE;
        s.store(e1 + nv::E_KEY_WORD, nv::key_word(b"abd"));
        s.store(e1 + nv::E_BLOB, blob_at);
        s.store(e1 + nv::E_META, long.encode());
        if blob_at + 8 <= s.size() && blob_at.is_multiple_of(8) {
            s.store(blob_at, blob::header_word(0, 20));
        }
    }

    #[test]
    fn sound_nv_leaf_passes() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        assert_eq!(nv_leaf(&s, DATA, DATA), Ok((1024, 2)));
    }

    #[test]
    fn nv_count_beyond_capacity() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        // More elements than any layout of the leaf holds.
        s.store(DATA + nv::COUNT_OFF, nv::max_count(1024) + 1);
        let d = nv_leaf(&s, DATA, DATA).unwrap_err();
        assert_eq!(d.off, DATA);
        assert!(d.what.contains("exceeds capacity"), "{}", d.what);
        // More than its layout (no compact prefix) holds.
        s.store(DATA + nv::COUNT_OFF, nv::capacity(1024) + 1);
        let d = nv_leaf(&s, DATA, DATA).unwrap_err();
        assert_eq!(d.off, DATA);
    }

    #[test]
    fn nv_size_beyond_pool() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        s.store(DATA + nv::SIZE_OFF, 1 << 40);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("invalid size"));
        s.store(DATA + nv::SIZE_OFF, 1000);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("invalid size"));
    }

    #[test]
    fn nv_compact_prefix_longer_than_count() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        s.store(DATA + nv::COMPACT_OFF, 3);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("compact prefix"));
    }

    #[test]
    fn nv_deletion_bit_past_the_elements() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        // Elements 0 and 1 may be marked deleted; element 2 does not exist.
        s.store(DATA + nv::GONE_OFF, 0b11);
        assert_eq!(nv_leaf(&s, DATA, DATA), Ok((1024, 2)));
        s.store(DATA + nv::GONE_OFF, 0b100);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("deleted past"));
        s.store(DATA + nv::GONE_OFF, 0);
        s.store(DATA + nv::GONE_OFF + 8, 1);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("deleted past"));
    }

    #[test]
    fn nv_element_metadata() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        let e0 = DATA + nv::ELEMS_OFF;
        s.store(e0 + nv::E_META, 9 << 56);
        let d = nv_leaf(&s, DATA, DATA).unwrap_err();
        assert_eq!(d.off, e0);
        assert!(d.what.contains("invalid metadata"), "{}", d.what);
    }

    #[test]
    fn nv_blob_offset_outside_the_pool() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, 1 << 30);
        let d = nv_leaf(&s, DATA, DATA).unwrap_err();
        assert_eq!(d.off, 1 << 30);
        assert!(d.what.contains("invalid blob reference"), "{}", d.what);
        // At the pool's end: no room for the blob's header. (A reference
        // off a line boundary cannot be stored: the blob word's low six
        // bits are check bits, masked off on read.)
        let s = space();
        nv_leaf_with_blob(&s, DATA, 64 * 1024);
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("invalid blob"));
    }

    #[test]
    fn nv_blob_length_overruns_the_pool() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        s.store(DATA + 2048, blob::header_word(0, 1 << 31));
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("overruns the pool"));
        s.store(DATA + 2048, blob::header_word(20, 20));
        assert!(nv_leaf(&s, DATA, DATA).unwrap_err().what.contains("do not match"));
    }

    #[test]
    fn nv_inline_element_with_blob_reference() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        s.store(DATA + nv::ELEMS_OFF + nv::E_BLOB, DATA + 2048);
        assert!(nv_leaf(&s, DATA, DATA)
            .unwrap_err()
            .what
            .contains("blob reference but inline"));
    }

    #[test]
    fn nv_chain_link() {
        let s = space();
        nv_leaf_with_blob(&s, DATA, DATA + 2048);
        for bad in [DATA + 1, 8, 1 << 40, DATA] {
            s.store(DATA + nv::NEXT_OFF, bad);
            let d = nv_leaf(&s, DATA, DATA).unwrap_err();
            assert!(d.what.contains("links to invalid offset"), "{bad}: {}", d.what);
        }
        s.store(DATA + nv::NEXT_OFF, DATA + 8192);
        assert!(nv_leaf(&s, DATA, DATA).is_ok());
    }

    #[test]
    fn nv_leaf_offset_outside_the_data_area() {
        let s = space();
        assert!(nv_leaf(&s, 64, DATA).is_err());
        assert!(nv_leaf(&s, 64 * 1024, DATA).is_err());
    }

    fn isle_leaf_at(s: &SimSpace, off: u64) -> u64 {
        let size = 640;
        s.store(off + il::SIZE_OFF, size);
        size
    }

    #[test]
    fn isle_codes() {
        let s = space();
        let size = isle_leaf_at(&s, DATA);
        assert_eq!(isle_leaf(&s, DATA, DATA), Ok(size));
        s.store(il::code_word(DATA, 0), 0xff);
        let d = isle_leaf(&s, DATA, DATA).unwrap_err();
        assert!(d.what.contains("invalid code"), "{}", d.what);
    }

    #[test]
    fn isle_general_slot_blob() {
        let s = space();
        let size = isle_leaf_at(&s, DATA);
        // Code of a general line with slot 0 live.
        let code = il::Code::encode(Kind::General, &[0]).unwrap();
        s.store(il::code_word(DATA, 0), code as u64);
        let e = il::g_elem(il::line(DATA, size, 0), 0);
        let meta = Meta {
            negative: false,
            key_inline: Some(8),
            value_inline: None,
            txn: false,
            version: 0,
        };
        s.store(e + nv::E_META, meta.encode());
        s.store(e + nv::E_BLOB, 1 << 33);
        let d = isle_leaf(&s, DATA, DATA).unwrap_err();
        assert!(d.what.contains("invalid blob reference"), "{}", d.what);
        s.store(e + nv::E_BLOB, DATA + 4096);
        s.store(DATA + 4096, blob::header_word(0, 12));
        assert_eq!(isle_leaf(&s, DATA, DATA), Ok(size));
        s.store(e + nv::E_META, meta.encode() | nv::NEGATIVE);
        assert!(isle_leaf(&s, DATA, DATA).unwrap_err().what.contains("NEGATIVE"));
    }

    #[test]
    fn isle_chain_link() {
        let s = space();
        isle_leaf_at(&s, DATA);
        s.store(DATA + il::NEXT_OFF, (DATA + 8192) | il::STALE);
        assert!(isle_leaf(&s, DATA, DATA).is_ok());
        s.store(DATA + il::NEXT_OFF, (1 << 41) | il::STALE);
        assert!(isle_leaf(&s, DATA, DATA).unwrap_err().what.contains("links to invalid"));
    }
}
