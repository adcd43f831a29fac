//! String commands. A string lives entirely in its metadata value
//! (`'m' key` → `'s' bytes`), so GET and SET are one engine access each.

use bytes::Bytes;

use super::{delete_key, eq, fail, int_arg, meta, CmdError, CmdResult, Cx, NOT_INT, OVERFLOW, SYNTAX, WRONGTYPE};
use crate::keys::{meta_key, Meta, MetaKey, STRING_TAG};
use crate::resp::Reply;
use crate::store::Kv;

/// The string value of `key`; `Err(WRONGTYPE)` for another type.
fn get_str(kv: &dyn Kv, key: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    match meta(kv, key)? {
        None => Ok(None),
        Some(Meta::String(v)) => Ok(Some(v)),
        Some(_) => fail(WRONGTYPE),
    }
}

/// Stores a string at `key`, replacing whatever type was there.
fn put_str(kv: &mut dyn Kv, key: &[u8], v: &[u8]) -> Result<(), CmdError> {
    let mk = MetaKey::new(key);
    // Only the type tag matters here: it is read in place, not copied out.
    let mut string = true;
    let found = kv.get_with(&mk, &mut |old| string = old.first() == Some(&STRING_TAG))?;
    if found && !string {
        if let Some(m) = meta(kv, key)? {
            delete_key(kv, key, &m)?;
        }
    }
    let mut enc = Vec::with_capacity(v.len() + 1);
    enc.push(STRING_TAG);
    enc.extend_from_slice(v);
    kv.put_owned(&mk, enc)?;
    Ok(())
}

fn opt_bulk(v: Option<Vec<u8>>) -> Reply {
    v.map_or(Reply::Nil, Reply::Bulk)
}

pub fn get(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(opt_bulk(get_str(kv, &a[1])?))
}

const NO_EXPIRY: &str =
    "ERR expiry is not supported by nvstore (EX, PX, EXAT, PXAT and KEEPTTL): keys stay until deleted";

/// SET key value [NX | XX] [GET] — expiry options answer an error.
pub fn set(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (mut nx, mut xx, mut get) = (false, false, false);
    for o in &a[3..] {
        if eq(o, "nx") && !xx {
            nx = true;
        } else if eq(o, "xx") && !nx {
            xx = true;
        } else if eq(o, "get") {
            get = true;
        } else if ["ex", "px", "exat", "pxat", "keepttl"].iter().any(|x| eq(o, x)) {
            return fail(NO_EXPIRY);
        } else {
            return fail(SYNTAX);
        }
    }
    let key = &a[1];
    if !(nx || xx || get) {
        put_str(kv, key, &a[2])?;
        return Ok(Reply::ok());
    }
    let old = match meta(kv, key)? {
        None => None,
        Some(Meta::String(v)) => Some(Some(v)),
        Some(_) if get => return fail(WRONGTYPE),
        Some(_) => Some(None),
    };
    let exists = old.is_some();
    let old_val = old.flatten();
    if (nx && exists) || (xx && !exists) {
        return Ok(if get { opt_bulk(old_val) } else { Reply::Nil });
    }
    put_str(kv, key, &a[2])?;
    Ok(if get { opt_bulk(old_val) } else { Reply::ok() })
}

pub fn setnx(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    if meta(kv, &a[1])?.is_some() {
        return Ok(Reply::Int(0));
    }
    put_str(kv, &a[1], &a[2])?;
    Ok(Reply::Int(1))
}

pub fn getset(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let old = get_str(kv, &a[1])?;
    put_str(kv, &a[1], &a[2])?;
    Ok(opt_bulk(old))
}

pub fn getdel(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let old = get_str(kv, &a[1])?;
    if old.is_some() {
        kv.delete(&meta_key(&a[1]))?;
    }
    Ok(opt_bulk(old))
}

/// MGET: a key of another type reads as nil, as in Redis.
pub fn mget(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut out = Vec::with_capacity(a.len() - 1);
    for k in &a[1..] {
        out.push(match meta(kv, k)? {
            Some(Meta::String(v)) => Reply::Bulk(v),
            _ => Reply::Nil,
        });
    }
    Ok(Reply::Array(out))
}

fn pairs_arity(a: &[Bytes]) -> Result<(), CmdError> {
    if a.len().is_multiple_of(2) {
        return Err(CmdError::Reply(super::wrong_arity(
            &String::from_utf8_lossy(&a[0]).to_lowercase(),
        )));
    }
    Ok(())
}

pub fn mset(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    pairs_arity(a)?;
    for p in a[1..].chunks(2) {
        put_str(kv, &p[0], &p[1])?;
    }
    Ok(Reply::ok())
}

pub fn msetnx(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    pairs_arity(a)?;
    for p in a[1..].chunks(2) {
        if meta(kv, &p[0])?.is_some() {
            return Ok(Reply::Int(0));
        }
    }
    for p in a[1..].chunks(2) {
        put_str(kv, &p[0], &p[1])?;
    }
    Ok(Reply::Int(1))
}

fn incr_by(kv: &mut dyn Kv, key: &[u8], by: i64) -> CmdResult {
    let cur = match get_str(kv, key)? {
        None => 0,
        Some(v) => crate::num::parse_i64(&v).map_or_else(|| fail(NOT_INT), Ok)?,
    };
    let Some(n) = cur.checked_add(by) else {
        return fail(OVERFLOW);
    };
    put_str(kv, key, n.to_string().as_bytes())?;
    Ok(Reply::Int(n))
}

pub fn incr(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    incr_by(kv, &a[1], 1)
}

pub fn decr(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    incr_by(kv, &a[1], -1)
}

pub fn incrby(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let by = int_arg(&a[2])?;
    incr_by(kv, &a[1], by)
}

pub fn decrby(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let by = int_arg(&a[2])?;
    let Some(neg) = by.checked_neg() else {
        return fail("ERR decrement would overflow");
    };
    incr_by(kv, &a[1], neg)
}

pub fn append(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut v = get_str(kv, &a[1])?.unwrap_or_default();
    v.extend_from_slice(&a[2]);
    put_str(kv, &a[1], &v)?;
    Ok(Reply::Int(v.len() as i64))
}

pub fn strlen(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(get_str(kv, &a[1])?.map_or(0, |v| v.len() as i64)))
}

/// GETRANGE key start end: inclusive, negative indices from the end, clamped.
pub fn getrange(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (s, e) = (int_arg(&a[2])?, int_arg(&a[3])?);
    let v = get_str(kv, &a[1])?.unwrap_or_default();
    let len = v.len() as i64;
    if len == 0 || (s < 0 && e < 0 && s > e) {
        return Ok(Reply::bulk(Vec::new()));
    }
    let s = if s < 0 { (len + s).max(0) } else { s };
    let e = if e < 0 { (len + e).max(0) } else { e.min(len - 1) };
    if s > e || s >= len {
        return Ok(Reply::bulk(Vec::new()));
    }
    Ok(Reply::bulk(&v[s as usize..=e as usize]))
}
