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

/// Order of the `len`-byte key stored at `off` (a blob's key bytes,
/// [`key_at`]) against `key`. Reads it in 64-byte chunks on the stack and
/// stops at the first difference: point reads compare keys this way, and
/// must not allocate.
pub fn cmp_key_at<S: Space>(s: &S, off: u64, len: u64, key: &[u8]) -> std::cmp::Ordering {
    let mut buf = [0u8; 64];
    let common = (len as usize).min(key.len());
    let mut done = 0;
    while done < common {
        let n = (common - done).min(buf.len());
        s.read(off + done as u64, &mut buf[..n]);
        match buf[..n].cmp(&key[done..done + n]) {
            std::cmp::Ordering::Equal => done += n,
            o => return o,
        }
    }
    (len as usize).cmp(&key.len())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::SimSpace;
    use std::cmp::Ordering;

    /// `cmp_key_at` orders a stored key against a probe as slices order,
    /// across its 64-byte chunks: differences before, at and after a chunk
    /// boundary, and keys that are prefixes of each other.
    #[test]
    fn a_stored_key_compares_as_its_bytes_do() {
        let s = SimSpace::new(1 << 16);
        let stored: Vec<u8> = (0..150u32).map(|i| (i * 7 % 251) as u8).collect();
        s.write(4096, &stored);
        let mut probes: Vec<Vec<u8>> = vec![Vec::new(), stored.clone()];
        for cut in [1, 63, 64, 65, 128, 149] {
            probes.push(stored[..cut].to_vec());
        }
        for at in [0, 5, 63, 64, 100, 128, 149] {
            for d in [1u8, 255] {
                let mut p = stored.clone();
                p[at] = p[at].wrapping_add(d);
                probes.push(p.clone());
                p.push(0);
                probes.push(p);
            }
        }
        let mut longer = stored.clone();
        longer.push(9);
        probes.push(longer);
        for len in [0u64, 1, 64, 65, 150] {
            let k = &stored[..len as usize];
            for p in &probes {
                assert_eq!(
                    cmp_key_at(&s, 4096, len, p),
                    k.cmp(p),
                    "stored {len} bytes, probe {p:?}"
                );
            }
        }
        assert_eq!(cmp_key_at(&s, 4096, 150, &stored), Ordering::Equal);
    }
}
