//! Elements: how one key/value write is encoded in four words, where its
//! out-of-line bytes (its blob, `format/blob.rs`) live, and how a stored
//! element and its blob are read back and validated. Both leaf formats
//! (`format/leaf_nv.rs`, `format/leaf_isle.rs`) store elements in this encoding.

use super::blob;
use super::leaf_nv::{self as nv, Meta};
use crate::pmem::{points, Space, LINE};

/// Encodes a new positive element; `blob` is 0 when key and value are inline.
pub fn encode(key: &[u8], value: &[u8], blob_off: u64, version: u64, txn: bool) -> [u64; 4] {
    let meta = Meta {
        negative: false,
        key_inline: (key.len() <= 8).then_some(key.len() as u8),
        value_inline: (value.len() <= 8).then_some(value.len() as u8),
        txn,
        version,
    };
    let value_word = if value.len() <= 8 { inline_value_word(value) } else { 0 };
    [nv::key_word(key), blob_off, value_word, meta.encode()]
}

/// The NEGATIVE twin of a stored element (same key, same blob), written at
/// `version`.
pub fn negate(words: [u64; 4], version: u64, txn: bool) -> [u64; 4] {
    let meta = (words[3] & !(nv::VERSION_MASK | nv::TXN))
        | nv::NEGATIVE
        | (version & nv::VERSION_MASK)
        | if txn { nv::TXN } else { 0 };
    [words[0], words[1], words[2], meta]
}

pub fn inline_value_word(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..v.len()].copy_from_slice(v);
    u64::from_le_bytes(b)
}

/// Writes the blob for `key`/`value` at `off` and flushes it (the element's
/// fence covers it).
pub fn write_blob<S: Space>(s: &S, off: u64, key: &[u8], value: &[u8]) {
    let k: &[u8] = if key.len() > 8 { key } else { &[] };
    let v: &[u8] = if value.len() > 8 { value } else { &[] };
    blob::write(s, off, k, v, points::BLOB_FLUSH);
}

/// Whether `key` and `value` need a blob, and of what size.
pub fn blob_size(key: &[u8], value: &[u8]) -> Option<u64> {
    let k = if key.len() > 8 { key.len() } else { 0 };
    let v = if value.len() > 8 { value.len() } else { 0 };
    (k + v > 0).then(|| blob::size(k, v))
}

/// Full key of an element given its words.
pub fn element_key<S: Space>(s: &S, words: &[u64; 4]) -> Vec<u8> {
    let meta = Meta::decode(words[3]).expect("valid meta");
    match meta.key_inline {
        Some(l) => nv::word_key(words[0], l as usize),
        None => {
            let (kl, _) = blob::lens(s.read_u64(words[1]));
            let mut k = vec![0u8; kl as usize];
            s.read(words[1] + blob::DATA_OFF, &mut k);
            k
        }
    }
}

/// Value of an element given its words.
pub fn element_value<S: Space>(s: &S, words: &[u64; 4]) -> Vec<u8> {
    let meta = Meta::decode(words[3]).expect("valid meta");
    match meta.value_inline {
        Some(l) => words[2].to_le_bytes()[..l as usize].to_vec(),
        None => {
            let (kl, vl) = blob::lens(s.read_u64(words[1]));
            let mut v = vec![0u8; vl as usize];
            s.read(words[1] + blob::DATA_OFF + kl, &mut v);
            v
        }
    }
}

/// Checks a blob reference: inside the pool, lengths consistent with the
/// element's metadata.
pub fn validate_blob<S: Space>(s: &S, b: u64, meta: Meta, pool: u64) -> std::result::Result<(), String> {
    if b == 0 || !b.is_multiple_of(LINE) || b > pool.saturating_sub(blob::DATA_OFF) {
        return Err(format!("invalid blob reference {b}"));
    }
    let (kl, vl) = blob::lens(s.read_u64(b));
    let want_k = meta.key_inline.is_none();
    let want_v = meta.value_inline.is_none();
    if want_k != (kl > 8) || (!want_k && kl != 0) || want_v != (vl > 8) || (!want_v && vl != 0) {
        return Err(format!("blob {b} lengths ({kl}, {vl}) do not match the element"));
    }
    if b + blob::DATA_OFF + kl + vl > pool {
        return Err(format!("blob {b} overruns the pool"));
    }
    Ok(())
}

/// An element's metadata and blob are valid (its key readable), for `check`.
pub fn leaf_blob_ok<S: Space>(s: &S, words: &[u64; 4], pool: u64) -> std::result::Result<(), String> {
    let meta = Meta::decode(words[3]).ok_or("invalid metadata")?;
    if meta.needs_blob() {
        validate_blob(s, words[1], meta, pool)
    } else {
        let _ = element_key(s, words);
        Ok(())
    }
}
