//! Saved state written at clean shutdown (NV-Tree §4.6 "instant recovery").
//!
//! ```text
//! { u64 magic | u64 words | u64 crc | u64 body[words - 3] }
//! body: { u64 key_count | u64 n_leaves | leaf[n_leaves] | u64 n_alloc | u64 alloc[n_alloc] }
//! leaf: { u64 offset | u64 bound_tag (0 -inf, 1 key, 2 +inf) | u64 key_len | u64 key[ceil(key_len/8)] }
//! ```
//!
//! The block is written and flushed, then the header's `clean_state` word is
//! set to its offset with one atomic store. On open the state is loaded,
//! `clean_state` is cleared (persisted) before any write, and the block is
//! freed. A bad magic or checksum falls back to a full rebuild.

use crate::pmem::Space;

pub const MAGIC: u64 = u64::from_le_bytes(*b"NVSAVED1");
pub const MAGIC_W: usize = 0;
pub const WORDS_W: usize = 1;
pub const CRC_W: usize = 2;
pub const BODY_W: usize = 3;

/// The header's clean word holds the saved state's offset in its low 48 bits
/// and the low 16 bits of the saved state's checksum above them, so the flag,
/// the pointer and the identity of the state are published by one store.
const CLEAN_TAG_SHIFT: u32 = 48;
const CLEAN_OFFSET_MASK: u64 = (1 << CLEAN_TAG_SHIFT) - 1;
const CLEAN_TAG_MASK: u64 = 0xffff;

/// The clean word naming the sealed state `sealed` written at `block`.
pub fn clean_word(block: u64, sealed: &[u64]) -> u64 {
    block | (tag(sealed) << CLEAN_TAG_SHIFT)
}

/// A clean word's parts: the saved state's offset and its tag.
pub fn clean_parts(word: u64) -> (u64, u64) {
    (word & CLEAN_OFFSET_MASK, word >> CLEAN_TAG_SHIFT)
}

/// The tag of sealed words (the low bits of their checksum), as the clean
/// word records it: a stale state left at the same offset has another.
pub fn tag(sealed: &[u64]) -> u64 {
    sealed[CRC_W] & CLEAN_TAG_MASK
}

/// The length word (in words, header included) of the sealed state at `at`.
pub fn words_at<S: Space>(s: &S, at: u64) -> u64 {
    s.read_u64(at + WORDS_W as u64 * 8)
}

/// Seals a body: prepends magic, length and checksum.
pub fn seal(body: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(body.len() + BODY_W);
    out.extend([MAGIC, (body.len() + BODY_W) as u64, crc(body)]);
    out.extend_from_slice(body);
    out
}

/// Checks magic, length and checksum of sealed words; returns the body.
pub fn open(words: &[u64]) -> Option<&[u64]> {
    if words.len() < BODY_W || words[MAGIC_W] != MAGIC || words[WORDS_W] as usize != words.len() {
        return None;
    }
    let body = &words[BODY_W..];
    (crc(body) == words[CRC_W]).then_some(body)
}

fn crc(body: &[u64]) -> u64 {
    let mut h = crc32fast::Hasher::new();
    for w in body {
        h.update(&w.to_le_bytes());
    }
    h.finalize() as u64
}

/// Appends a byte string as `len` + words.
pub fn put_bytes(out: &mut Vec<u64>, b: &[u8]) {
    out.push(b.len() as u64);
    for c in b.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        out.push(u64::from_le_bytes(w));
    }
}

/// Reads a byte string written by [`put_bytes`].
pub fn get_bytes<I: Iterator<Item = u64> + ?Sized>(it: &mut I) -> Option<Vec<u8>> {
    let len = it.next()? as usize;
    if len > 1 << 20 {
        return None;
    }
    let mut b = Vec::with_capacity(len);
    for _ in 0..len.div_ceil(8) {
        b.extend_from_slice(&it.next()?.to_le_bytes());
    }
    b.truncate(len);
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_and_open() {
        let mut body = vec![1, 2];
        put_bytes(&mut body, b"hello world");
        let sealed = seal(&body);
        assert_eq!(open(&sealed), Some(&body[..]));
        let mut bad = sealed.clone();
        bad[4] ^= 1;
        assert_eq!(open(&bad), None);
        let mut it = body[2..].iter().copied();
        assert_eq!(get_bytes(&mut it).unwrap(), b"hello world");
    }
}
