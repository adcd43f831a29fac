//! The leaf-format trait (DESIGN §7) and the `nv` format (seed 000 §4.3–4.4).
//!
//! The tree, recovery, `check` and the crash tests are generic over
//! [`LeafFormat`]; a format decides how elements sit in a leaf, how an append
//! is made durable and published, and how a new leaf is built for a split.

use crate::format::blob;
use crate::format::leaf_nv::{self as nv, Meta};
use crate::pmem::{points, Space, LINE};

/// One element as stored: its full key (loaded) and its raw words.
#[derive(Clone, Debug)]
pub struct Elem {
    pub key: Vec<u8>,
    pub words: [u64; 4],
}

impl Elem {
    pub fn meta(&self) -> Meta {
        Meta::decode(self.words[3]).expect("element meta validated on load")
    }
    pub fn negative(&self) -> bool {
        self.words[3] & nv::NEGATIVE != 0
    }
    pub fn blob(&self) -> u64 {
        self.words[1]
    }
}

/// One element read for a bulk operation (split, scan, recovery): its raw
/// words and, only for keys longer than 8 bytes, the key bytes. Inline keys
/// are never materialised unless asked for.
#[derive(Clone, Debug)]
pub struct Slot {
    pub words: [u64; 4],
    pub long_key: Option<Box<[u8]>>,
}

impl Slot {
    pub fn negative(&self) -> bool {
        self.words[3] & nv::NEGATIVE != 0
    }
    pub fn blob(&self) -> u64 {
        self.words[1]
    }
    fn inline_len(&self) -> Option<usize> {
        Meta::decode(self.words[3])
            .expect("validated meta")
            .key_inline
            .map(|l| l as usize)
    }
    /// The full key.
    pub fn key(&self) -> Vec<u8> {
        match &self.long_key {
            Some(k) => k.to_vec(),
            None => nv::word_key(self.words[0], self.inline_len().unwrap_or(0)),
        }
    }
    /// Order of this element's key relative to `key`, without allocating.
    pub fn cmp_bytes(&self, key: &[u8]) -> std::cmp::Ordering {
        match &self.long_key {
            Some(k) => k.as_ref().cmp(key),
            None => {
                let w = self.words[0].to_be_bytes();
                w[..self.inline_len().unwrap_or(0)].cmp(key)
            }
        }
    }

    /// Whether the value is in a blob.
    pub fn value_in_blob(&self) -> bool {
        Meta::decode(self.words[3])
            .expect("validated meta")
            .value_inline
            .is_none()
    }

    /// The value, if it is inline (no pool access needed).
    pub fn inline_value(&self) -> Option<Vec<u8>> {
        let meta = Meta::decode(self.words[3]).expect("validated meta");
        meta.value_inline
            .map(|l| self.words[2].to_le_bytes()[..l as usize].to_vec())
    }

    /// Bytewise key order, deciding on the prefix word where it can.
    pub fn key_cmp(&self, other: &Slot) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match self.words[0].cmp(&other.words[0]) {
            Ordering::Equal => {}
            o => return o,
        }
        // Equal words: an inline key is a prefix of any longer key with the same word.
        match (&self.long_key, &other.long_key) {
            (None, None) => self.inline_len().cmp(&other.inline_len()),
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(b),
        }
    }
}

/// A leaf's elements collated: the newest element of each key that is
/// positive, in key order, and what is left behind.
pub struct Collated {
    pub valid: Vec<Slot>,
    /// Blobs referenced only by elements that are not kept.
    pub dropped_blobs: Vec<u64>,
    /// Largest key among all elements (negative ones too), for recovery bounds.
    pub max_key: Option<Vec<u8>>,
}

/// Reads elements `0..n` of a leaf and collates them: one stable sort by key,
/// then the last element of each run of equal keys is the newest.
pub fn collate<S: Space>(s: &S, leaf: u64, n: u64) -> Collated {
    let mut all: Vec<Slot> = (0..n)
        .map(|i| {
            let words = load_words(s, nv::elem(leaf, i));
            let long_key = match Meta::decode(words[3])
                .expect("published element has valid meta")
                .key_inline
            {
                Some(_) => None,
                None => Some(element_key(s, &words).into_boxed_slice()),
            };
            Slot { words, long_key }
        })
        .collect();
    all.sort_by(|a, b| a.key_cmp(b)); // stable: equal keys stay in append order
    let max_key = all.last().map(|x| x.key());
    let mut valid = Vec::with_capacity(all.len());
    let mut dropped = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j].key_cmp(&all[i]).is_eq() {
            j += 1;
        }
        let newest = &all[j - 1];
        let keep_blob = if newest.negative() { 0 } else { newest.blob() };
        for x in &all[i..j] {
            if x.blob() != 0 && x.blob() != keep_blob {
                dropped.push(x.blob());
            }
        }
        if !newest.negative() {
            valid.push(newest.clone());
        }
        i = j;
    }
    dropped.sort_unstable();
    dropped.dedup();
    Collated {
        valid,
        dropped_blobs: dropped,
        max_key,
    }
}

/// What a leaf search found for a key.
pub enum Lookup {
    /// The newest element for the key is positive, at this index.
    Present(u64),
    /// The key was deleted or never written here.
    Absent,
}

/// A leaf layout.
pub trait LeafFormat: Send + Sync + 'static {
    const NAME: &'static str;

    /// Elements a leaf of `size` bytes holds.
    fn capacity(size: u64) -> u64;
    /// Published element count (persistent).
    fn count<S: Space>(s: &S, leaf: u64) -> u64;
    fn next<S: Space>(s: &S, leaf: u64) -> u64;
    /// Byte size recorded in the leaf.
    fn size<S: Space>(s: &S, leaf: u64) -> u64;
    /// Offset of the word that links the leaf to its right sibling.
    fn next_word(leaf: u64) -> u64;

    /// Newest element for `key` among the first `n`.
    fn lookup<S: Space>(s: &S, leaf: u64, n: u64, key: &[u8]) -> Lookup;
    /// Reads element `i` (key loaded from the blob if needed).
    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem;
    /// The value of element `i`.
    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8>;

    /// Appends `elems` after the first `n` and publishes them with one
    /// count store: write, flush, fence, store count, flush, fence.
    fn append<S: Space>(s: &S, leaf: u64, n: u64, elems: &[[u64; 4]]);

    /// Writes a complete new leaf (unlinked, flushed but not fenced: the
    /// caller fences once for all new leaves of a split).
    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]);
}

/// The NV-Tree leaf: unsorted, append-only, published by its count.
pub struct Nv;

/// Encodes a new positive element; `blob` is 0 when key and value are inline.
pub fn encode(key: &[u8], value: &[u8], blob_off: u64) -> [u64; 4] {
    let meta = Meta {
        negative: false,
        key_inline: (key.len() <= 8).then_some(key.len() as u8),
        value_inline: (value.len() <= 8).then_some(value.len() as u8),
        version: 0,
    };
    let value_word = if value.len() <= 8 { inline_value_word(value) } else { 0 };
    [nv::key_word(key), blob_off, value_word, meta.encode()]
}

/// The NEGATIVE twin of a stored element (same key, same blob).
pub fn negate(words: [u64; 4]) -> [u64; 4] {
    [words[0], words[1], words[2], words[3] | nv::NEGATIVE]
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
    let mut buf = Vec::with_capacity(blob::size(k.len(), v.len()) as usize);
    buf.extend_from_slice(&blob::header_word(k.len(), v.len()).to_le_bytes());
    buf.extend_from_slice(k);
    buf.extend_from_slice(v);
    s.write(off, &buf);
    s.flush(off, buf.len() as u64, points::BLOB_FLUSH);
}

/// Whether `key` and `value` need a blob, and of what size.
pub fn blob_size(key: &[u8], value: &[u8]) -> Option<u64> {
    let k = if key.len() > 8 { key.len() } else { 0 };
    let v = if value.len() > 8 { value.len() } else { 0 };
    (k + v > 0).then(|| blob::size(k, v))
}

fn load_words<S: Space>(s: &S, e: u64) -> [u64; 4] {
    [
        s.read_u64(e + nv::E_KEY_WORD),
        s.read_u64(e + nv::E_BLOB),
        s.read_u64(e + nv::E_VALUE_WORD),
        s.read_u64(e + nv::E_META),
    ]
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

impl LeafFormat for Nv {
    const NAME: &'static str = "nv";

    #[inline]
    fn capacity(size: u64) -> u64 {
        nv::capacity(size)
    }
    #[inline]
    fn count<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::COUNT_OFF)
    }
    #[inline]
    fn next<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::NEXT_OFF)
    }
    #[inline]
    fn size<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::SIZE_OFF)
    }
    #[inline]
    fn next_word(leaf: u64) -> u64 {
        leaf + nv::NEXT_OFF
    }

    fn lookup<S: Space>(s: &S, leaf: u64, n: u64, key: &[u8]) -> Lookup {
        let kw = nv::key_word(key);
        // Newest first: the newest element for a key decides (a NEGATIVE one
        // cancels the positive it follows, seed 000 §4.3).
        for i in (0..n).rev() {
            let e = nv::elem(leaf, i);
            if s.read_u64(e + nv::E_KEY_WORD) != kw {
                continue;
            }
            let meta_w = s.read_u64(e + nv::E_META);
            let meta = Meta::decode(meta_w).expect("published element has valid meta");
            let same = match meta.key_inline {
                Some(l) => l as usize == key.len(),
                None => {
                    key.len() > 8 && {
                        let b = s.read_u64(e + nv::E_BLOB);
                        let (kl, _) = blob::lens(s.read_u64(b));
                        kl as usize == key.len() && {
                            let mut k = vec![0u8; key.len()];
                            s.read(b + blob::DATA_OFF, &mut k);
                            k == key
                        }
                    }
                }
            };
            if same {
                return if meta.negative {
                    Lookup::Absent
                } else {
                    Lookup::Present(i)
                };
            }
        }
        Lookup::Absent
    }

    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem {
        let words = load_words(s, nv::elem(leaf, i));
        Elem {
            key: element_key(s, &words),
            words,
        }
    }

    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8> {
        element_value(s, &load_words(s, nv::elem(leaf, i)))
    }

    fn append<S: Space>(s: &S, leaf: u64, n: u64, elems: &[[u64; 4]]) {
        let at = nv::elem(leaf, n);
        let mut buf = [0u8; 2 * nv::ELEM_SIZE as usize];
        let len = elems.len() * nv::ELEM_SIZE as usize;
        for (j, w) in elems.iter().enumerate() {
            for (k, word) in w.iter().enumerate() {
                let o = j * 32 + k * 8;
                buf[o..o + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        s.write(at, &buf[..len]);
        s.flush(at, len as u64, points::NV_ELEMENT_FLUSH);
        s.fence(points::NV_ELEMENT_FENCE);
        s.publish(
            leaf + nv::COUNT_OFF,
            n + elems.len() as u64,
            points::NV_COUNT_FLUSH,
            points::NV_COUNT_FENCE,
        );
    }

    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]) {
        assert!(elems.len() as u64 <= nv::capacity(size));
        let used = nv::ELEMS_OFF + elems.len() as u64 * nv::ELEM_SIZE;
        let mut buf = vec![0u8; used as usize];
        buf[nv::COUNT_OFF as usize..][..8].copy_from_slice(&(elems.len() as u64).to_le_bytes());
        buf[nv::NEXT_OFF as usize..][..8].copy_from_slice(&next.to_le_bytes());
        buf[nv::SIZE_OFF as usize..][..8].copy_from_slice(&size.to_le_bytes());
        for (j, e) in elems.iter().enumerate() {
            for (k, word) in e.words.iter().enumerate() {
                let o = (nv::ELEMS_OFF + j as u64 * nv::ELEM_SIZE) as usize + k * 8;
                buf[o..o + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        s.write(leaf, &buf);
        s.flush(leaf, used.max(LINE), points::NV_NEWLEAF_FLUSH);
    }
}
