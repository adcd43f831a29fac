//! How Redis data types are laid out as ordered keys in the tree (the way
//! Kvrocks maps them onto RocksDB). `docs/server.md` has the same table.
//!
//! ```text
//! key in the tree                               value
//! 'm' user_key                                  metadata: { u8 type | ... }
//!                                                 string: 's' value bytes
//!                                                 hash:   'h' u64 LE field count
//!                                                 small hash: 'H' u32 LE n, then n times
//!                                                   { u32 LE len, field, u32 LE len, value }
//!                                                   in field order (no sub-keys)
//!                                                 zset:   'z' u64 LE member count
//!                                                 small zset: 'Z' u32 LE n, then n times
//!                                                   { score8, u32 LE len, member }
//!                                                   in (score, member) order (no sub-keys)
//! 'h' u32 BE len(user_key) user_key field       hash field value
//! 'z' u32 BE len(user_key) user_key member      zset score: score8 (below)
//! 'Z' u32 BE len(user_key) user_key score8 member   (empty) — the score index
//! 0x00 ...                                      reserved for the server's own records
//! ```
//!
//! `score8` is the order-preserving encoding of an f64 ([`score_key`]): byte
//! order equals numeric order, so a score range is a key range and members
//! with equal scores follow in member byte order, as Redis orders them.
//! The length prefix keeps one user key's fields apart from another's that
//! it prefixes (`a` vs `ab`). Every user key has exactly one metadata key,
//! so KEYS/SCAN/TYPE/EXISTS read only the `m` range; a hash or zset exists
//! iff its metadata exists and it has at least one field/member (an empty
//! one is deleted with its last field, in the same transaction).

pub const META: u8 = b'm';
pub const HASH: u8 = b'h';
pub const ZMEMBER: u8 = b'z';
pub const ZSCORE: u8 = b'Z';

/// The type tag in a metadata value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    String,
    Hash,
    ZSet,
}

impl Type {
    pub fn name(self) -> &'static str {
        match self {
            Type::String => "string",
            Type::Hash => "hash",
            Type::ZSet => "zset",
        }
    }

    fn tag(self) -> u8 {
        match self {
            Type::String => b's',
            Type::Hash => b'h',
            Type::ZSet => b'z',
        }
    }
}

/// A decoded metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Meta {
    String(Vec<u8>),
    /// A hash stored one key per field (`'h' len key field`).
    Hash {
        count: u64,
    },
    /// A small hash stored whole in its metadata value: (field, value)
    /// pairs sorted by field, no duplicates, never empty.
    SmallHash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A sorted set stored one key pair per member (`'z'` and `'Z'` keys).
    ZSet {
        count: u64,
    },
    /// A small sorted set stored whole in its metadata value: (score,
    /// member) in (score, member) order, members distinct, no NaN, never
    /// empty.
    SmallZSet(Vec<(f64, Vec<u8>)>),
}

/// When a hash is stored compactly in its metadata value (as Redis keeps
/// small hashes in one listpack): at most `entries` fields, each field and
/// value at most `value` bytes, and the whole encoding at most `bytes`
/// bytes. A hash that outgrows a limit moves to one key per field in the
/// same transaction as the write that outgrew it; it never moves back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactLimits {
    pub entries: usize,
    pub value: usize,
    pub bytes: usize,
}

impl Default for CompactLimits {
    fn default() -> Self {
        CompactLimits {
            entries: 128,
            value: 1024,
            bytes: 16 << 10,
        }
    }
}

impl CompactLimits {
    /// Whether `pairs` may be stored compactly.
    pub fn fits(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> bool {
        pairs.len() <= self.entries
            && pairs
                .iter()
                .all(|(f, v)| f.len() <= self.value && v.len() <= self.value)
            && small_hash_len(pairs) <= self.bytes
    }

    /// Whether a sorted set's `items` may be stored compactly (`value`
    /// limits each member).
    pub fn fits_zset(&self, items: &[(f64, Vec<u8>)]) -> bool {
        items.len() <= self.entries
            && items.iter().all(|(_, m)| m.len() <= self.value)
            && small_zset_len(items) <= self.bytes
    }
}

/// Bytes of a small sorted set's metadata value.
pub fn small_zset_len(items: &[(f64, Vec<u8>)]) -> usize {
    5 + items.iter().map(|(_, m)| 12 + m.len()).sum::<usize>()
}

/// The order of a small sorted set's items: score, then member bytes
/// (the order of the `'Z'` keys).
pub fn zset_order(a: &(f64, Vec<u8>), b: &(f64, Vec<u8>)) -> std::cmp::Ordering {
    (score_bytes(a.0), &a.1).cmp(&(score_bytes(b.0), &b.1))
}

/// The items of a small sorted set's metadata value (tag included), checked
/// as written: lengths in bounds, scores canonical and not NaN, items
/// strictly ascending in (score, member), members distinct, nothing left
/// over, at least one item. `None` for bytes no server wrote.
fn decode_small_zset(v: &[u8]) -> Option<Vec<(f64, Vec<u8>)>> {
    if v.first() != Some(&SMALL_ZSET_TAG) {
        return None;
    }
    let n = u32::from_le_bytes(v.get(1..5)?.try_into().ok()?) as usize;
    let mut rest = &v[5..];
    let mut items: Vec<(f64, Vec<u8>)> = Vec::new();
    let mut prev: Option<(&[u8], &[u8])> = None;
    for _ in 0..n {
        let s8 = rest.get(..8)?;
        rest = &rest[8..];
        let m = take_len_prefixed(&mut rest)?;
        let s = score_from_bytes(s8);
        if s.is_nan() || score_bytes(s) != s8 || prev.is_some_and(|p| p >= (s8, m)) {
            return None;
        }
        prev = Some((s8, m));
        items.push((s, m.to_vec()));
    }
    if !rest.is_empty() || n == 0 {
        return None;
    }
    let mut members: Vec<&[u8]> = items.iter().map(|(_, m)| m.as_slice()).collect();
    members.sort_unstable();
    if members.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    Some(items)
}

/// Bytes of a small hash's metadata value.
pub fn small_hash_len(pairs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    5 + pairs.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>()
}

fn decode_small_hash(v: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    check_small_hash(v)?;
    Some(SmallPairs::new(v).map(|(f, val)| (f.to_vec(), val.to_vec())).collect())
}

/// The number of pairs of a small hash's metadata value (tag included),
/// checked as [`Meta::decode`] checks it (lengths in bounds, fields
/// strictly ascending, nothing left over, at least one pair); `None` for
/// bytes no server wrote. [`SmallPairs`] reads a checked value in place.
pub fn check_small_hash(v: &[u8]) -> Option<usize> {
    if v.first() != Some(&SMALL_HASH_TAG) {
        return None;
    }
    let n = u32::from_le_bytes(v.get(1..5)?.try_into().ok()?) as usize;
    let mut rest = &v[5..];
    let mut prev: Option<&[u8]> = None;
    for _ in 0..n {
        let f = take_len_prefixed(&mut rest)?;
        take_len_prefixed(&mut rest)?;
        if prev.is_some_and(|p| p >= f) {
            return None;
        }
        prev = Some(f);
    }
    (rest.is_empty() && n > 0).then_some(n)
}

fn take_len_prefixed<'a>(v: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = u32::from_le_bytes(v.get(..4)?.try_into().ok()?) as usize;
    let b = v.get(4..4usize.checked_add(n)?)?;
    *v = &v[4 + n..];
    Some(b)
}

/// The (field, value) pairs of a small hash's metadata value, borrowed, in
/// field order. The value must have passed [`check_small_hash`]; on other
/// bytes the iteration stops early.
pub struct SmallPairs<'a> {
    rest: &'a [u8],
}

impl<'a> SmallPairs<'a> {
    pub fn new(v: &'a [u8]) -> Self {
        SmallPairs {
            rest: v.get(5..).unwrap_or_default(),
        }
    }
}

impl<'a> Iterator for SmallPairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let f = take_len_prefixed(&mut self.rest)?;
        let v = take_len_prefixed(&mut self.rest)?;
        Some((f, v))
    }
}

/// Writes `pairs` (sorted by field, no duplicates) as a small hash's
/// metadata value, the one [`Meta::SmallHash`] encodes to.
pub fn encode_small_hash<'a>(n: usize, pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>, out: &mut Vec<u8>) {
    out.push(SMALL_HASH_TAG);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for (f, v) in pairs {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
}

impl Meta {
    pub fn ty(&self) -> Type {
        match self {
            Meta::String(_) => Type::String,
            Meta::Hash { .. } | Meta::SmallHash(_) => Type::Hash,
            Meta::ZSet { .. } | Meta::SmallZSet(_) => Type::ZSet,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            Meta::String(v) => {
                let mut out = Vec::with_capacity(v.len() + 1);
                out.push(Type::String.tag());
                out.extend_from_slice(v);
                out
            }
            Meta::Hash { count } | Meta::ZSet { count } => {
                let mut out = vec![self.ty().tag()];
                out.extend_from_slice(&count.to_le_bytes());
                out
            }
            Meta::SmallHash(pairs) => {
                let mut out = Vec::with_capacity(small_hash_len(pairs));
                encode_small_hash(
                    pairs.len(),
                    pairs.iter().map(|(f, v)| (f.as_slice(), v.as_slice())),
                    &mut out,
                );
                out
            }
            Meta::SmallZSet(items) => {
                let mut out = Vec::with_capacity(small_zset_len(items));
                out.push(SMALL_ZSET_TAG);
                out.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for (s, m) in items {
                    out.extend_from_slice(&score_bytes(*s));
                    out.extend_from_slice(&(m.len() as u32).to_le_bytes());
                    out.extend_from_slice(m);
                }
                out
            }
        }
    }

    /// `None` for bytes no server wrote (reported as a corrupt value).
    pub fn decode(mut v: Vec<u8>) -> Option<Meta> {
        let tag = *v.first()?;
        let count = || v.get(1..9).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        match tag {
            b's' => {
                v.remove(0);
                Some(Meta::String(v))
            }
            b'h' if v.len() == 9 => Some(Meta::Hash { count: count()? }),
            b'z' if v.len() == 9 => Some(Meta::ZSet { count: count()? }),
            SMALL_HASH_TAG => decode_small_hash(&v).map(Meta::SmallHash),
            SMALL_ZSET_TAG => decode_small_zset(&v).map(Meta::SmallZSet),
            _ => None,
        }
    }
}

/// The metadata tag of a small hash.
pub const SMALL_HASH_TAG: u8 = b'H';
/// The metadata tag of a small sorted set (a value tag: not the `'Z'`
/// key namespace).
pub const SMALL_ZSET_TAG: u8 = b'Z';
/// The metadata tag of a string (the value follows it).
pub const STRING_TAG: u8 = b's';

/// [`meta_key`] on the stack for user keys of up to 63 bytes: the hot
/// paths (GET, HGET, HGETALL, one-key writes) look a key up without
/// allocating.
pub struct MetaKey(smallvec::SmallVec<[u8; 64]>);

impl MetaKey {
    pub fn new(user: &[u8]) -> MetaKey {
        let mut k = smallvec::SmallVec::with_capacity(user.len() + 1);
        k.push(META);
        k.extend_from_slice(user);
        MetaKey(k)
    }
}

impl std::ops::Deref for MetaKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

pub fn meta_key(user: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(user.len() + 1);
    k.push(META);
    k.extend_from_slice(user);
    k
}

/// `ns u32BE(len) user`: the prefix of every sub-key of `user` in namespace `ns`.
pub fn sub_prefix(ns: u8, user: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(user.len() + 5);
    k.push(ns);
    k.extend_from_slice(&(user.len() as u32).to_be_bytes());
    k.extend_from_slice(user);
    k
}

pub fn sub_key(ns: u8, user: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut k = sub_prefix(ns, user);
    k.extend_from_slice(rest);
    k
}

/// Order-preserving 8 bytes for a score: flip the sign bit of positives,
/// every bit of negatives. `-0.0` is stored as `0.0` (Redis treats them equal).
pub fn score_bytes(s: f64) -> [u8; 8] {
    let s = if s == 0.0 { 0.0 } else { s };
    let b = s.to_bits();
    let o = if b >> 63 == 1 { !b } else { b ^ (1 << 63) };
    o.to_be_bytes()
}

pub fn score_from_bytes(b: &[u8]) -> f64 {
    let o = u64::from_be_bytes(b[..8].try_into().unwrap());
    let b = if o >> 63 == 1 { o ^ (1 << 63) } else { !o };
    f64::from_bits(b)
}

/// Score-index key of (`user`, `score`, `member`).
pub fn score_key(user: &[u8], score: f64, member: &[u8]) -> Vec<u8> {
    let mut k = sub_prefix(ZSCORE, user);
    k.extend_from_slice(&score_bytes(score));
    k.extend_from_slice(member);
    k
}

/// Smallest key greater than every key starting with `p` (`None`: no such key).
pub fn prefix_end(p: &[u8]) -> Option<Vec<u8>> {
    let mut e = p.to_vec();
    while let Some(&b) = e.last() {
        if b == 0xff {
            e.pop();
        } else {
            *e.last_mut().unwrap() += 1;
            return Some(e);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_bytes_preserve_order() {
        let v = [
            f64::NEG_INFINITY,
            -1e300,
            -2.5,
            -1.0,
            -1e-300,
            0.0,
            1e-300,
            1.0,
            2.5,
            1e300,
            f64::INFINITY,
        ];
        for w in v.windows(2) {
            assert!(score_bytes(w[0]) < score_bytes(w[1]), "{} < {}", w[0], w[1]);
        }
        for x in v {
            assert_eq!(score_from_bytes(&score_bytes(x)), x);
        }
        assert_eq!(score_bytes(-0.0), score_bytes(0.0));
    }

    #[test]
    fn small_hash_check_refuses_what_decode_refuses() {
        let pairs = vec![(b"a".to_vec(), b"1".to_vec()), (b"bc".to_vec(), Vec::new())];
        let v = Meta::SmallHash(pairs.clone()).encode();
        assert_eq!(check_small_hash(&v), Some(2));
        let lent: Vec<(Vec<u8>, Vec<u8>)> = SmallPairs::new(&v).map(|(f, x)| (f.to_vec(), x.to_vec())).collect();
        assert_eq!(lent, pairs);
        let unsorted = Meta::SmallHash(vec![pairs[1].clone(), pairs[0].clone()]).encode();
        let dup = Meta::SmallHash(vec![pairs[0].clone(), pairs[0].clone()]).encode();
        let mut trailing = v.clone();
        trailing.push(0);
        let mut huge = v.clone();
        huge[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        for bad in [
            unsorted,
            dup,
            trailing,
            huge,
            v[..v.len() - 1].to_vec(),
            vec![b'H', 0, 0, 0, 0],
            vec![b'H'],
        ] {
            assert_eq!(check_small_hash(&bad), None, "{bad:?}");
            assert_eq!(Meta::decode(bad), None);
        }
    }

    #[test]
    fn meta_round_trips() {
        for m in [
            Meta::String(b"abc".to_vec()),
            Meta::String(vec![]),
            Meta::Hash { count: 7 },
            Meta::ZSet { count: 1 << 40 },
            Meta::SmallHash(vec![(b"a".to_vec(), vec![]), (b"b".to_vec(), b"xyz".to_vec())]),
            Meta::SmallZSet(vec![(-2.0, b"z".to_vec()), (3.5, b"a".to_vec())]),
        ] {
            assert_eq!(Meta::decode(m.encode()), Some(m));
        }
        assert_eq!(Meta::decode(vec![]), None);
        assert_eq!(Meta::decode(vec![b'h', 1]), None);
        // Small hashes: empty, truncated, trailing bytes and unsorted fields are corrupt.
        assert_eq!(Meta::decode(vec![b'H', 0, 0, 0, 0]), None);
        let good = Meta::SmallHash(vec![(b"a".to_vec(), b"1".to_vec())]).encode();
        assert_eq!(Meta::decode(good[..good.len() - 1].to_vec()), None);
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Meta::decode(long), None);
        let unsorted = [
            b'H', 2, 0, 0, 0, 1, 0, 0, 0, b'b', 0, 0, 0, 0, 1, 0, 0, 0, b'a', 0, 0, 0, 0,
        ];
        assert_eq!(Meta::decode(unsorted.to_vec()), None);
    }

    #[test]
    fn small_zset_decode_refuses_bytes_no_server_wrote() {
        let m = |s: f64, x: &str| (s, x.as_bytes().to_vec());
        let good = vec![m(-1.5, "b"), m(0.0, "a"), m(0.0, "c"), m(f64::INFINITY, "")];
        let v = Meta::SmallZSet(good.clone()).encode();
        assert_eq!(v.len(), small_zset_len(&good));
        assert_eq!(Meta::decode(v.clone()), Some(Meta::SmallZSet(good.clone())));
        let enc = |items: Vec<(f64, Vec<u8>)>| Meta::SmallZSet(items).encode();
        // The first score's 8 bytes (after the tag and the count).
        let mut negzero = enc(vec![m(0.0, "a")]);
        negzero[5..13].copy_from_slice(&(!(-0.0f64).to_bits()).to_be_bytes());
        let mut nan = enc(vec![m(1.0, "a")]);
        nan[5..13].copy_from_slice(&score_bytes(f64::NAN));
        let mut trailing = v.clone();
        trailing.push(0);
        let mut huge = v.clone();
        huge[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        for bad in [
            enc(vec![m(1.0, "a"), m(0.0, "b")]),
            enc(vec![m(0.0, "b"), m(0.0, "a")]),
            enc(vec![m(0.0, "a"), m(0.0, "a")]),
            enc(vec![m(0.0, "a"), m(1.0, "a")]),
            negzero,
            nan,
            trailing,
            huge,
            v[..v.len() - 1].to_vec(),
            vec![b'Z', 0, 0, 0, 0],
            vec![b'Z'],
        ] {
            assert_eq!(Meta::decode(bad.clone()), None, "{bad:?}");
        }
        let l = CompactLimits {
            entries: 2,
            value: 3,
            bytes: 100,
        };
        assert!(l.fits_zset(&[m(1.0, "abc"), m(2.0, "")]));
        assert!(!l.fits_zset(&[m(1.0, "abcd")]));
        assert!(!l.fits_zset(&[m(1.0, "a"), m(2.0, "b"), m(3.0, "c")]));
        assert!(CompactLimits { bytes: 20, ..l }.fits_zset(&[m(1.0, "abc")]));
        assert!(!CompactLimits { bytes: 19, ..l }.fits_zset(&[m(1.0, "abc")]));
    }

    proptest::proptest! {
        /// Decoding accepts exactly the bytes encoding writes: whatever
        /// metadata value is read (a server's, one byte changed, random
        /// bytes after any tag), it is refused or it encodes back to the
        /// same bytes. So a damaged value is never half-read.
        #[test]
        fn decode_accepts_only_what_encode_writes(
            zitems in proptest::collection::vec((-4i8..4, proptest::collection::vec(0u8..4, 0..3)), 1..6),
            hpairs in proptest::collection::vec((proptest::collection::vec(0u8..4, 0..3), proptest::collection::vec(0u8..4, 0..3)), 1..6),
            pick in 0usize..4,
            at in proptest::num::usize::ANY,
            to in proptest::num::u8::ANY,
            tag in proptest::sample::select(vec![b's', b'h', b'z', b'H', b'Z', b'x']),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
        ) {
            let mut z: Vec<(f64, Vec<u8>)> = Vec::new();
            for (s, m) in zitems {
                if !z.iter().any(|(_, x)| *x == m) {
                    z.push((f64::from(s) / 2.0, m));
                }
            }
            z.sort_by(zset_order);
            let mut h = hpairs;
            h.sort();
            h.dedup_by(|a, b| a.0 == b.0);
            let metas = [
                Meta::SmallZSet(z),
                Meta::SmallHash(h),
                Meta::ZSet { count: 3 },
                Meta::String(b"abc".to_vec()),
            ];
            let good = metas[pick].encode();
            proptest::prop_assert_eq!(Meta::decode(good.clone()).map(|m| m.encode()), Some(good.clone()));
            let mut changed = good.clone();
            let i = at % changed.len();
            changed[i] = to;
            let mut random = vec![tag];
            random.extend_from_slice(&body);
            for v in [changed, random, good[..good.len() - 1].to_vec()] {
                if let Some(m) = Meta::decode(v.clone()) {
                    proptest::prop_assert_eq!(m.encode(), v);
                }
            }
        }
    }

    #[test]
    fn compact_limits() {
        let l = CompactLimits {
            entries: 2,
            value: 3,
            bytes: 100,
        };
        let p = |f: &str, v: &str| (f.as_bytes().to_vec(), v.as_bytes().to_vec());
        assert!(l.fits(&[p("a", "abc"), p("b", "")]));
        assert!(!l.fits(&[p("a", "abcd")]));
        assert!(!l.fits(&[p("a", ""), p("b", ""), p("c", "")]));
        let tight = CompactLimits { bytes: 19, ..l };
        assert!(tight.fits(&[p("abc", "abc")]));
        assert!(!tight.fits(&[p("abc", "abc"), p("d", "")]));
        assert_eq!(
            small_hash_len(&[p("abc", "abc")]),
            Meta::SmallHash(vec![p("abc", "abc")]).encode().len()
        );
    }

    #[test]
    fn length_prefix_separates_keys_that_prefix_each_other() {
        let a = sub_prefix(HASH, b"a");
        let ab = sub_key(HASH, b"ab", b"");
        assert!(!ab.starts_with(&a));
    }
}
