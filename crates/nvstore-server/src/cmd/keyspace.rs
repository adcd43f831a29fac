//! Commands over the key space: DEL, EXISTS, TYPE, OBJECT, KEYS, SCAN,
//! DBSIZE, FLUSHDB, and the ordered reads NV.RANGE / NV.PREFIX. Every user key has
//! one `'m'` metadata key, so these walk the `'m'` range in key order.

use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use super::{delete_key, eq, fail, meta, prefix_scan, write_txn, CmdError, CmdResult, Cx, SYNTAX};
use crate::keys::{self, Meta, META};
use crate::resp::Reply;
use crate::shared::Shared;
use crate::store::Kv;

pub fn del(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut n = 0;
    for k in &a[1..] {
        if let Some(m) = meta(kv, k)? {
            delete_key(kv, k, &m)?;
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}

pub fn exists(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut n = 0;
    for k in &a[1..] {
        if kv.get(&keys::meta_key(k))?.is_some() {
            n += 1;
        }
    }
    Ok(Reply::Int(n))
}

pub fn type_(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::StatusOwned(
        meta(kv, &a[1])?.map_or("none", |m| m.ty().name()).to_string(),
    ))
}

/// OBJECT ENCODING | REFCOUNT | FREQ | IDLETIME key, OBJECT HELP.
///
/// ENCODING names the layout in Redis' words, so a client can see which
/// values are compact: a string `int`, `embstr` or `raw` by its bytes (as
/// Redis encodes a value it is given; Redis also answers `raw` for a short
/// string grown by APPEND, which nvstore does not track), a hash `listpack`
/// (small, one value) or `hashtable` (one key per field), a sorted set
/// `listpack` or `skiplist` (two keys per member). REFCOUNT is always 1
/// (values are not shared). Neither access frequency nor idle time is
/// tracked: FREQ answers Redis' error for a server without an LFU policy,
/// IDLETIME an error that says so.
pub fn object(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let sub = String::from_utf8_lossy(&a[1]).to_lowercase();
    let arity = match sub.as_str() {
        "help" => 2,
        "encoding" | "refcount" | "freq" | "idletime" => 3,
        _ => {
            return fail(format!(
                "ERR unknown subcommand '{}'. Try OBJECT HELP.",
                String::from_utf8_lossy(&a[1])
            ))
        }
    };
    if a.len() != arity {
        return Err(CmdError::Reply(super::wrong_arity(&format!("object|{sub}"))));
    }
    if sub == "help" {
        let lines = [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>.",
            "FREQ <key>",
            "    Not tracked by nvstore serve (no LFU policy).",
            "IDLETIME <key>",
            "    Not tracked by nvstore serve.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key> (always 1: values are not shared).",
            "HELP",
            "    Prints this help.",
        ];
        return Ok(Reply::Array(
            lines.iter().map(|l| Reply::StatusOwned(l.to_string())).collect(),
        ));
    }
    let Some(m) = meta(kv, &a[2])? else {
        return Ok(Reply::Nil);
    };
    match sub.as_str() {
        "encoding" => Ok(Reply::bulk(encoding(&m).as_bytes())),
        "refcount" => Ok(Reply::Int(1)),
        "freq" => fail(
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when \
             switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ),
        _ => fail("ERR nvstore serve does not track access times: OBJECT IDLETIME is not supported"),
    }
}

/// Redis' name for how `m` is stored.
fn encoding(m: &Meta) -> &'static str {
    match m {
        // parse_i64 reads at most 20 bytes, as Redis' check does.
        Meta::String(v) if crate::num::parse_i64(v).is_some() => "int",
        Meta::String(v) if v.len() <= 44 => "embstr",
        Meta::String(_) => "raw",
        Meta::SmallHash(_) | Meta::SmallZSet(_) => "listpack",
        Meta::Hash { .. } => "hashtable",
        Meta::ZSet { .. } => "skiplist",
    }
}

pub fn dbsize(kv: &mut dyn Kv, _: &Cx, _: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(prefix_scan(kv, &[META], false).count() as i64))
}

fn flush_args(a: &[Bytes]) -> Result<(), CmdError> {
    match a.len() {
        1 => Ok(()),
        2 if eq(&a[1], "sync") || eq(&a[1], "async") => Ok(()),
        _ => fail(SYNTAX),
    }
}

/// FLUSHDB inside MULTI: every key, in the transaction.
pub fn flushdb(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    flush_args(a)?;
    let users: Vec<Vec<u8>> = prefix_scan(kv, &[META], false).map(|(k, _)| k[1..].to_vec()).collect();
    for u in users {
        if let Some(m) = meta(kv, &u)? {
            delete_key(kv, &u, &m)?;
        }
    }
    Ok(Reply::ok())
}

/// FLUSHDB / FLUSHALL outside MULTI: deletes keys in transactions of up to
/// 256 user keys each, so each key disappears whole (its fields with its
/// metadata) and no commit grows unbounded. A crash midway leaves some keys,
/// each intact.
pub fn flush_in_chunks(sh: &Arc<Shared>, a: &[Bytes]) -> Reply {
    if let Err(CmdError::Reply(r)) = flush_args(a) {
        return r;
    }
    loop {
        let mut done = false;
        let r = write_txn(sh, |t| {
            let users: Vec<Vec<u8>> = prefix_scan(t, &[META], false)
                .take(256)
                .map(|(k, _)| k[1..].to_vec())
                .collect();
            done = users.is_empty();
            for u in &users {
                if let Some(m) = meta(t, u)? {
                    delete_key(t, u, &m)?;
                }
            }
            Ok(Reply::ok())
        });
        if r.is_error() || done {
            return r;
        }
    }
}

/// Redis glob matching (`stringmatchlen`): `*`, `?`, `[a-z]`, `[^x]`, `\x`.
pub fn glob(p: &[u8], s: &[u8]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some(b'*') => {
            let rest = &p[1..];
            if rest.is_empty() {
                return true;
            }
            (0..=s.len()).any(|i| glob(rest, &s[i..]))
        }
        Some(b'?') => !s.is_empty() && glob(&p[1..], &s[1..]),
        Some(b'[') => {
            let Some(&c) = s.first() else { return false };
            let mut i = 1;
            let neg = p.get(i) == Some(&b'^');
            if neg {
                i += 1;
            }
            let mut hit = false;
            while i < p.len() && p[i] != b']' {
                if p[i] == b'\\' && i + 1 < p.len() {
                    hit |= p[i + 1] == c;
                    i += 2;
                } else if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
                    let (lo, hi) = (p[i].min(p[i + 2]), p[i].max(p[i + 2]));
                    hit |= (lo..=hi).contains(&c);
                    i += 3;
                } else {
                    hit |= p[i] == c;
                    i += 1;
                }
            }
            let after = if i < p.len() { i + 1 } else { i };
            hit != neg && glob(&p[after..], &s[1..])
        }
        Some(b'\\') if p.len() > 1 => !s.is_empty() && s[0] == p[1] && glob(&p[2..], &s[1..]),
        Some(&c) => !s.is_empty() && s[0] == c && glob(&p[1..], &s[1..]),
    }
}

/// The literal prefix of a glob pattern (up to its first special character).
fn literal_prefix(p: &[u8]) -> &[u8] {
    let end = p
        .iter()
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
        .unwrap_or(p.len());
    &p[..end]
}

pub fn keys(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let pat = &a[1];
    let mut p = vec![META];
    p.extend_from_slice(literal_prefix(pat));
    let exact_prefix = pat.len() == p.len() && pat.ends_with(b"*");
    let out = prefix_scan(kv, &p, false)
        .map(|(k, _)| k[1..].to_vec())
        .filter(|u| exact_prefix || glob(pat, u))
        .map(Reply::Bulk)
        .collect();
    Ok(Reply::Array(out))
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]. Cursors are numbers that
/// name the last key returned (kept server-side, as Kvrocks does); keys come
/// in key order and MATCH's literal prefix bounds the walk.
pub fn scan(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let Some(cursor) = std::str::from_utf8(&a[1]).ok().and_then(|s| s.parse::<u64>().ok()) else {
        return fail("ERR invalid cursor");
    };
    let (mut pat, mut count, mut ty): (Option<&[u8]>, usize, Option<&[u8]>) = (None, 10, None);
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return fail(SYNTAX);
        }
        if eq(&a[i], "match") {
            pat = Some(&a[i + 1]);
        } else if eq(&a[i], "count") {
            let n = super::int_arg(&a[i + 1])?;
            if n < 1 {
                return fail(SYNTAX);
            }
            count = n as usize;
        } else if eq(&a[i], "type") {
            ty = Some(&a[i + 1]);
        } else {
            return fail(SYNTAX);
        }
        i += 2;
    }
    let mut p = vec![META];
    if let Some(pat) = pat {
        p.extend_from_slice(literal_prefix(pat));
    }
    let hi = match keys::prefix_end(&p) {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    let lo = if cursor == 0 {
        Bound::Included(p.clone())
    } else {
        match cx.sh.cursors.lock().get(cursor) {
            Some(last) if last.starts_with(&p) => Bound::Excluded(last),
            Some(_) => Bound::Included(p.clone()),
            None => return fail("ERR invalid cursor"),
        }
    };
    let mut out = Vec::new();
    let mut last = None;
    let mut more = false;
    for (n, (k, v)) in kv.scan(lo, hi, false).enumerate() {
        if n == count {
            more = true;
            break;
        }
        let u = &k[1..];
        let ok_pat = pat.is_none_or(|p| glob(p, u));
        let ok_ty = ty.is_none_or(|t| Meta::decode(v).is_some_and(|m| eq(t, m.ty().name())));
        if ok_pat && ok_ty {
            out.push(Reply::bulk(u));
        }
        last = Some(k);
    }
    let next = match (more, last) {
        (true, Some(k)) => cx.sh.cursors.lock().insert(k),
        _ => 0,
    };
    Ok(Reply::Array(vec![Reply::bulk(next.to_string()), Reply::Array(out)]))
}

/// Options of NV.RANGE / NV.PREFIX: LIMIT n, WITHVALUES, REV (range only).
fn nv_opts(a: &[Bytes], allow_rev: bool) -> Result<(usize, bool, bool), CmdError> {
    let (mut limit, mut values, mut rev) = (usize::MAX, false, false);
    let mut i = 0;
    while i < a.len() {
        if eq(&a[i], "limit") && i + 1 < a.len() {
            let n = super::int_arg(&a[i + 1])?;
            if n < 0 {
                return fail("ERR LIMIT must not be negative");
            }
            limit = n as usize;
            i += 1;
        } else if eq(&a[i], "withvalues") {
            values = true;
        } else if allow_rev && eq(&a[i], "rev") {
            rev = true;
        } else {
            return fail(SYNTAX);
        }
        i += 1;
    }
    Ok((limit, values, rev))
}

/// String keys (with values) from an `'m'` range, in order.
fn nv_collect(kv: &dyn Kv, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>, limit: usize, values: bool, rev: bool) -> Reply {
    let mut out = Vec::new();
    for (k, v) in kv
        .scan(lo, hi, rev)
        .filter(|(_, v)| v.first() == Some(&b's'))
        .take(limit)
    {
        out.push(Reply::bulk(&k[1..]));
        if values {
            out.push(Reply::bulk(&v[1..]));
        }
    }
    Reply::Array(out)
}

/// NV.RANGE start end [LIMIT n] [WITHVALUES] [REV]: string keys in
/// `[start, end]` in key order (`-` and `+` are open ends).
pub fn nv_range(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (limit, values, rev) = nv_opts(&a[3..], true)?;
    let lo = if &a[1][..] == b"-" {
        Bound::Included(vec![META])
    } else {
        Bound::Included(keys::meta_key(&a[1]))
    };
    let hi = if &a[2][..] == b"+" {
        Bound::Excluded(vec![META + 1])
    } else {
        Bound::Included(keys::meta_key(&a[2]))
    };
    let empty = match (&lo, &hi) {
        (Bound::Included(l), Bound::Included(h)) => l > h,
        _ => false,
    };
    if empty {
        return Ok(Reply::Array(Vec::new()));
    }
    Ok(nv_collect(kv, lo, hi, limit, values, rev))
}

/// NV.PREFIX p [LIMIT n] [WITHVALUES]: string keys starting with `p`.
pub fn nv_prefix(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (limit, values, _) = nv_opts(&a[2..], false)?;
    let p = keys::meta_key(&a[1]);
    let hi = match keys::prefix_end(&p) {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    Ok(nv_collect(kv, Bound::Included(p), hi, limit, values, false))
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_like_redis() {
        assert!(glob(b"user:*", b"user:1"));
        assert!(glob(b"*", b""));
        assert!(glob(b"h?llo", b"hello"));
        assert!(!glob(b"h?llo", b"hllo"));
        assert!(glob(b"h[ae]llo", b"hallo"));
        assert!(!glob(b"h[^e]llo", b"hello"));
        assert!(glob(b"h[a-f]llo", b"hello"));
        assert!(glob(b"a\\*b", b"a*b"));
        assert!(!glob(b"a\\*b", b"axb"));
        assert!(glob(b"*:*:x", b"a:b:x"));
    }
}
