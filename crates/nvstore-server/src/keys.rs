//! How Redis data types are laid out as ordered keys in the tree (the way
//! Kvrocks maps them onto RocksDB). `docs/server.md` has the same table.
//!
//! ```text
//! key in the tree                               value
//! 'm' user_key                                  metadata: { u8 type | ... }
//!                                                 string: 's' value bytes
//!                                                 hash:   'h' u64 LE field count
//!                                                 zset:   'z' u64 LE member count
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
    Hash { count: u64 },
    ZSet { count: u64 },
}

impl Meta {
    pub fn ty(&self) -> Type {
        match self {
            Meta::String(_) => Type::String,
            Meta::Hash { .. } => Type::Hash,
            Meta::ZSet { .. } => Type::ZSet,
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
            _ => None,
        }
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
    fn meta_round_trips() {
        for m in [
            Meta::String(b"abc".to_vec()),
            Meta::String(vec![]),
            Meta::Hash { count: 7 },
            Meta::ZSet { count: 1 << 40 },
        ] {
            assert_eq!(Meta::decode(m.encode()), Some(m));
        }
        assert_eq!(Meta::decode(vec![]), None);
        assert_eq!(Meta::decode(vec![b'h', 1]), None);
    }

    #[test]
    fn length_prefix_separates_keys_that_prefix_each_other() {
        let a = sub_prefix(HASH, b"a");
        let ab = sub_key(HASH, b"ab", b"");
        assert!(!ab.starts_with(&a));
    }
}
