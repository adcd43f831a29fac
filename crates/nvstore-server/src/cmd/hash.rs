//! Hash commands, over two layouts (see `keys.rs`):
//!
//! - **small** (the default for new hashes): every (field, value) pair in
//!   the metadata value itself, sorted by field. HGETALL is one point read
//!   and HSET one single-key write, which the engine commits in one leaf
//!   with one count store (atomic across crashes, no commit record).
//! - **large**: fields are keys `'h' len(key) key field`; the metadata
//!   holds the field count and is rewritten by every write to the hash (so
//!   a WATCH on the key sees field changes too).
//!
//! A small hash that outgrows [`CompactLimits`] moves to the large layout
//! inside the transaction of the write that outgrew it: the field keys and
//! the new metadata commit together, so a crash leaves either the small
//! hash before the write or the large one after it. Large hashes stay
//! large (as in Redis), and pools written before small hashes existed
//! read as they are.

use bytes::Bytes;

use super::{fail, int_arg, meta, prefix_scan, CmdError, CmdResult, Cx, OVERFLOW, WRONGTYPE};
use crate::keys::{
    check_small_hash, encode_small_hash, meta_key, sub_key, sub_prefix, CompactLimits, Meta, MetaKey, SmallPairs, HASH,
};
use crate::resp::Reply;
use crate::store::Kv;

/// (field, value) pairs of a hash, in field order.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A hash as its metadata says it is stored.
enum Repr {
    Absent,
    Small(Pairs),
    Large { count: u64 },
}

/// Hash `key`'s layout (`Absent` if missing); WRONGTYPE for another type.
fn load(kv: &dyn Kv, key: &[u8]) -> Result<Repr, CmdError> {
    match meta(kv, key)? {
        None => Ok(Repr::Absent),
        Some(Meta::SmallHash(p)) => Ok(Repr::Small(p)),
        Some(Meta::Hash { count }) => Ok(Repr::Large { count }),
        Some(_) => fail(WRONGTYPE),
    }
}

fn store_count(kv: &mut dyn Kv, key: &[u8], count: u64) -> Result<(), CmdError> {
    if count == 0 {
        kv.delete(&meta_key(key))?;
    } else {
        kv.put(&meta_key(key), &Meta::Hash { count }.encode())?;
    }
    Ok(())
}

/// Stores the pairs of a hash that was small (or absent) before this
/// command: compactly if they fit, else moved to one key per field, all in
/// the caller's transaction.
fn store_small(kv: &mut dyn Kv, key: &[u8], pairs: Pairs, lim: &CompactLimits) -> Result<(), CmdError> {
    if pairs.is_empty() {
        kv.delete(&meta_key(key))?;
    } else if lim.fits(&pairs) {
        kv.put(&meta_key(key), &Meta::SmallHash(pairs).encode())?;
    } else {
        for (f, v) in &pairs {
            kv.put(&sub_key(HASH, key, f), v)?;
        }
        store_count(kv, key, pairs.len() as u64)?;
    }
    Ok(())
}

/// Sets `field` in sorted `pairs`; true if it was new.
fn small_set(pairs: &mut Pairs, field: &[u8], value: &[u8]) -> bool {
    match pairs.binary_search_by(|(f, _)| f.as_slice().cmp(field)) {
        Ok(i) => {
            pairs[i].1 = value.to_vec();
            false
        }
        Err(i) => {
            pairs.insert(i, (field.to_vec(), value.to_vec()));
            true
        }
    }
}

fn small_get<'p>(pairs: &'p Pairs, field: &[u8]) -> Option<&'p Vec<u8>> {
    pairs
        .binary_search_by(|(f, _)| f.as_slice().cmp(field))
        .ok()
        .map(|i| &pairs[i].1)
}

fn hset_pairs(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> Result<i64, CmdError> {
    if !a.len().is_multiple_of(2) {
        return Err(CmdError::Reply(super::wrong_arity(
            &String::from_utf8_lossy(&a[0]).to_lowercase(),
        )));
    }
    let key = &a[1];
    if let Some(added) = hset_small_in_place(kv, key, &a[2..], &cx.sh.cfg.compact)? {
        return Ok(added);
    }
    let mut added = 0;
    match load(kv, key)? {
        Repr::Absent => {
            let mut pairs = Vec::with_capacity(a.len() / 2 - 1);
            for p in a[2..].chunks(2) {
                added += small_set(&mut pairs, &p[0], &p[1]) as i64;
            }
            store_small(kv, key, pairs, &cx.sh.cfg.compact)?;
        }
        Repr::Small(mut pairs) => {
            for p in a[2..].chunks(2) {
                added += small_set(&mut pairs, &p[0], &p[1]) as i64;
            }
            store_small(kv, key, pairs, &cx.sh.cfg.compact)?;
        }
        Repr::Large { mut count } => {
            for p in a[2..].chunks(2) {
                let fk = sub_key(HASH, key, &p[0]);
                if kv.get(&fk)?.is_none() {
                    added += 1;
                    count += 1;
                }
                kv.put(&fk, &p[1])?;
            }
            store_count(kv, key, count)?;
        }
    }
    Ok(added)
}

/// HSET on a hash that is absent or small and stays small: the new
/// metadata value is merged from the stored one, read in place, and the
/// arguments, without decoding either into owned pairs. `None` when the
/// general path must decide: a large hash, another type, damaged
/// metadata, or a result over the limits (which moves the hash to one key
/// per field).
fn hset_small_in_place(
    kv: &mut dyn Kv,
    key: &[u8],
    args: &[Bytes],
    lim: &CompactLimits,
) -> Result<Option<i64>, CmdError> {
    // Pairs on the stack for up to 16 fields (YCSB writes 1 or 10).
    let mut new: RefPairs = args.chunks(2).map(|p| (&p[0][..], &p[1][..])).collect();
    // The sort is stable: of repeated fields, the last argument wins.
    new.sort_by(|x, y| x.0.cmp(y.0));
    let mut uniq = RefPairs::with_capacity(new.len());
    for p in new {
        match uniq.last_mut() {
            Some(l) if l.0 == p.0 => *l = p,
            _ => uniq.push(p),
        }
    }
    let mk = MetaKey::new(key);
    let mut merged = None;
    let found = kv.get_with(&mk, &mut |v| {
        if check_small_hash(v).is_some() {
            merged = merge_small(SmallPairs::new(v), &uniq, lim);
        }
    })?;
    if !found {
        merged = merge_small(std::iter::empty(), &uniq, lim);
    }
    match merged {
        Some((enc, added)) => {
            kv.put_owned(&mk, enc)?;
            Ok(Some(added))
        }
        None => Ok(None),
    }
}

/// Field-value pairs borrowed from arguments or a stored value.
type RefPairs<'a> = smallvec::SmallVec<[(&'a [u8], &'a [u8]); 16]>;

/// The small-hash encoding of `old` (sorted) with `new` (sorted, unique)
/// set over it, and how many of `new` were not in `old`; `None` if the
/// result is over the limits.
fn merge_small<'a>(
    old: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    new: &[(&'a [u8], &'a [u8])],
    lim: &CompactLimits,
) -> Option<(Vec<u8>, i64)> {
    let mut old = old.peekable();
    let mut new = new.iter().copied().peekable();
    let mut all = RefPairs::new();
    let mut added = 0;
    loop {
        let next = match (old.peek(), new.peek()) {
            (Some(o), Some(n)) => match o.0.cmp(n.0) {
                std::cmp::Ordering::Less => old.next(),
                std::cmp::Ordering::Equal => {
                    old.next();
                    new.next()
                }
                std::cmp::Ordering::Greater => {
                    added += 1;
                    new.next()
                }
            },
            (Some(_), None) => old.next(),
            (None, Some(_)) => {
                added += 1;
                new.next()
            }
            (None, None) => break,
        };
        all.extend(next);
    }
    let bytes = 5 + all.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>();
    let fits = all.len() <= lim.entries
        && all.iter().all(|(f, v)| f.len() <= lim.value && v.len() <= lim.value)
        && bytes <= lim.bytes;
    if !fits {
        return None;
    }
    let mut enc = Vec::with_capacity(bytes);
    encode_small_hash(all.len(), all.into_iter(), &mut enc);
    Some((enc, added))
}

pub fn hset(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(hset_pairs(kv, cx, a)?))
}

pub fn hmset(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    hset_pairs(kv, cx, a)?;
    Ok(Reply::ok())
}

pub fn hsetnx(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    match load(kv, &a[1])? {
        Repr::Absent => {
            store_small(kv, &a[1], vec![(a[2].to_vec(), a[3].to_vec())], &cx.sh.cfg.compact)?;
        }
        Repr::Small(mut pairs) => {
            if !small_set(&mut pairs, &a[2], &a[3]) {
                return Ok(Reply::Int(0));
            }
            store_small(kv, &a[1], pairs, &cx.sh.cfg.compact)?;
        }
        Repr::Large { count } => {
            let fk = sub_key(HASH, &a[1], &a[2]);
            if kv.get(&fk)?.is_some() {
                return Ok(Reply::Int(0));
            }
            kv.put(&fk, &a[3])?;
            store_count(kv, &a[1], count + 1)?;
        }
    }
    Ok(Reply::Int(1))
}

/// The value of one field.
fn field(kv: &dyn Kv, repr: &Repr, key: &[u8], f: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    Ok(match repr {
        Repr::Absent => None,
        Repr::Small(p) => small_get(p, f).cloned(),
        Repr::Large { .. } => kv.get(&sub_key(HASH, key, f))?,
    })
}

pub fn hget(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let repr = load(kv, &a[1])?;
    Ok(field(kv, &repr, &a[1], &a[2])?.map_or(Reply::Nil, Reply::Bulk))
}

pub fn hmget(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let repr = load(kv, &a[1])?;
    let mut out = Vec::with_capacity(a.len() - 2);
    for f in &a[2..] {
        out.push(field(kv, &repr, &a[1], f)?.map_or(Reply::Nil, Reply::Bulk));
    }
    Ok(Reply::Array(out))
}

fn fields(kv: &dyn Kv, key: &[u8]) -> Result<Pairs, CmdError> {
    match load(kv, key)? {
        Repr::Absent | Repr::Large { count: 0 } => Ok(Vec::new()),
        Repr::Small(p) => Ok(p),
        Repr::Large { .. } => {
            let p = sub_prefix(HASH, key);
            Ok(prefix_scan(kv, &p, false)
                .map(|(k, v)| (k[p.len()..].to_vec(), v))
                .collect())
        }
    }
}

pub fn hgetall(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let f = fields(kv, &a[1])?;
    Ok(Reply::Map(
        f.into_iter().map(|(k, v)| (Reply::Bulk(k), Reply::Bulk(v))).collect(),
    ))
}

pub fn hkeys(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Array(
        fields(kv, &a[1])?.into_iter().map(|(k, _)| Reply::Bulk(k)).collect(),
    ))
}

pub fn hvals(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Array(
        fields(kv, &a[1])?.into_iter().map(|(_, v)| Reply::Bulk(v)).collect(),
    ))
}

pub fn hdel(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let mut removed = 0;
    match load(kv, &a[1])? {
        Repr::Absent | Repr::Large { count: 0 } => {}
        Repr::Small(mut pairs) => {
            for f in &a[2..] {
                if let Ok(i) = pairs.binary_search_by(|(p, _)| p.as_slice().cmp(f)) {
                    pairs.remove(i);
                    removed += 1;
                }
            }
            if removed > 0 {
                store_small(kv, &a[1], pairs, &cx.sh.cfg.compact)?;
            }
        }
        Repr::Large { mut count } => {
            for f in &a[2..] {
                let fk = sub_key(HASH, &a[1], f);
                if kv.get(&fk)?.is_some() {
                    kv.delete(&fk)?;
                    removed += 1;
                    count -= 1;
                }
            }
            if removed > 0 {
                store_count(kv, &a[1], count)?;
            }
        }
    }
    Ok(Reply::Int(removed))
}

pub fn hlen(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(match load(kv, &a[1])? {
        Repr::Absent => 0,
        Repr::Small(p) => p.len() as i64,
        Repr::Large { count } => count as i64,
    }))
}

pub fn hexists(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let repr = load(kv, &a[1])?;
    Ok(Reply::Int(field(kv, &repr, &a[1], &a[2])?.is_some() as i64))
}

pub fn hincrby(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let by = int_arg(&a[3])?;
    let repr = load(kv, &a[1])?;
    let cur = match field(kv, &repr, &a[1], &a[2])? {
        None => 0,
        Some(v) => crate::num::parse_i64(&v).map_or_else(|| fail("ERR hash value is not an integer"), Ok)?,
    };
    let Some(n) = cur.checked_add(by) else {
        return fail(OVERFLOW);
    };
    let nv = n.to_string();
    match repr {
        Repr::Absent => store_small(kv, &a[1], vec![(a[2].to_vec(), nv.into_bytes())], &cx.sh.cfg.compact)?,
        Repr::Small(mut pairs) => {
            small_set(&mut pairs, &a[2], nv.as_bytes());
            store_small(kv, &a[1], pairs, &cx.sh.cfg.compact)?;
        }
        Repr::Large { mut count } => {
            let fk = sub_key(HASH, &a[1], &a[2]);
            if kv.get(&fk)?.is_none() {
                count += 1;
            }
            kv.put(&fk, nv.as_bytes())?;
            store_count(kv, &a[1], count)?;
        }
    }
    Ok(Reply::Int(n))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::cmd::fast::tests::{args, below, shared};
    use crate::cmd::{execute, Conn};
    use crate::keys::{CompactLimits, Meta};
    use crate::resp::Reply;
    use crate::Config;

    /// HSET merged in place (fields repeated within one command, new and
    /// old fields, a hash growing past the limits) answers and stores what
    /// a map does.
    #[test]
    fn hset_matches_a_map_across_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            compact: CompactLimits {
                entries: 6,
                value: 8,
                bytes: 120,
            },
            ..Config::default()
        };
        let sh = shared(&dir, cfg);
        let mut c = Conn::new(1, true);
        let mut next = below(0x9e37_79b9_7f4a_7c15u64);
        for key in ["k0", "k1", "k2", "k3"] {
            let mut model = BTreeMap::new();
            for _ in 0..12 {
                let mut cmd = vec!["hset".to_string(), key.to_string()];
                let mut added = 0;
                let mut seen = std::collections::BTreeSet::new();
                for _ in 0..1 + next(3) {
                    let f = format!("f{}", next(9));
                    let v = "v".repeat(next(10) as usize);
                    if !model.contains_key(&f) && seen.insert(f.clone()) {
                        added += 1;
                    }
                    cmd.push(f);
                    cmd.push(v);
                }
                for p in cmd[2..].chunks(2) {
                    model.insert(p[0].clone(), p[1].clone());
                }
                let words: Vec<&str> = cmd.iter().map(String::as_str).collect();
                assert_eq!(execute(&sh, &mut c, args(&words)), Reply::Int(added), "{cmd:?}");
                let got = execute(&sh, &mut c, args(&["hgetall", key]));
                let want = Reply::Map(
                    model
                        .iter()
                        .map(|(f, v)| (Reply::bulk(f.as_bytes()), Reply::bulk(v.as_bytes())))
                        .collect(),
                );
                assert_eq!(got, want, "{cmd:?}");
                // Small while within the limits; once large, large for good.
                let small = matches!(
                    Meta::decode(
                        sh.store
                            .db()
                            .get(&crate::keys::meta_key(key.as_bytes()))
                            .unwrap()
                            .unwrap()
                    ),
                    Some(Meta::SmallHash(_))
                );
                let fits = model.len() <= 6
                    && model.values().all(|v| v.len() <= 8)
                    && 5 + model.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>() <= 120;
                if small {
                    assert!(fits, "{cmd:?}");
                }
            }
        }
    }
}
