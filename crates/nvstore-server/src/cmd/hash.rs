//! Hash commands. Fields are keys `'h' len(key) key field`; the metadata
//! holds the field count and is rewritten by every write to the hash (so a
//! WATCH on the key sees field changes too).

use bytes::Bytes;

use super::{fail, int_arg, meta, prefix_scan, CmdError, CmdResult, Cx, OVERFLOW, WRONGTYPE};
use crate::keys::{meta_key, sub_key, sub_prefix, Meta, HASH};
use crate::resp::Reply;
use crate::store::Kv;

/// The field count of hash `key` (0 if absent); WRONGTYPE for another type.
fn hash_count(kv: &dyn Kv, key: &[u8]) -> Result<u64, CmdError> {
    match meta(kv, key)? {
        None => Ok(0),
        Some(Meta::Hash { count }) => Ok(count),
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

fn hset_pairs(kv: &mut dyn Kv, a: &[Bytes]) -> Result<i64, CmdError> {
    if !a.len().is_multiple_of(2) {
        return Err(CmdError::Reply(super::wrong_arity(
            &String::from_utf8_lossy(&a[0]).to_lowercase(),
        )));
    }
    let key = &a[1];
    let mut count = hash_count(kv, key)?;
    let mut added = 0;
    for p in a[2..].chunks(2) {
        let fk = sub_key(HASH, key, &p[0]);
        if kv.get(&fk)?.is_none() {
            added += 1;
            count += 1;
        }
        kv.put(&fk, &p[1])?;
    }
    store_count(kv, key, count)?;
    Ok(added)
}

pub fn hset(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(hset_pairs(kv, a)?))
}

pub fn hmset(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    hset_pairs(kv, a)?;
    Ok(Reply::ok())
}

pub fn hsetnx(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let count = hash_count(kv, &a[1])?;
    let fk = sub_key(HASH, &a[1], &a[2]);
    if kv.get(&fk)?.is_some() {
        return Ok(Reply::Int(0));
    }
    kv.put(&fk, &a[3])?;
    store_count(kv, &a[1], count + 1)?;
    Ok(Reply::Int(1))
}

pub fn hget(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    if hash_count(kv, &a[1])? == 0 {
        return Ok(Reply::Nil);
    }
    Ok(kv.get(&sub_key(HASH, &a[1], &a[2]))?.map_or(Reply::Nil, Reply::Bulk))
}

pub fn hmget(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let exists = hash_count(kv, &a[1])? > 0;
    let mut out = Vec::with_capacity(a.len() - 2);
    for f in &a[2..] {
        let v = if exists {
            kv.get(&sub_key(HASH, &a[1], f))?
        } else {
            None
        };
        out.push(v.map_or(Reply::Nil, Reply::Bulk));
    }
    Ok(Reply::Array(out))
}

/// (field, value) pairs of hash `key`, in field order.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn fields(kv: &dyn Kv, key: &[u8]) -> Result<Pairs, CmdError> {
    if hash_count(kv, key)? == 0 {
        return Ok(Vec::new());
    }
    let p = sub_prefix(HASH, key);
    Ok(prefix_scan(kv, &p, false)
        .map(|(k, v)| (k[p.len()..].to_vec(), v))
        .collect())
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

pub fn hdel(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut count = hash_count(kv, &a[1])?;
    if count == 0 {
        return Ok(Reply::Int(0));
    }
    let mut removed = 0;
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
    Ok(Reply::Int(removed))
}

pub fn hlen(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(hash_count(kv, &a[1])? as i64))
}

pub fn hexists(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    if hash_count(kv, &a[1])? == 0 {
        return Ok(Reply::Int(0));
    }
    Ok(Reply::Int(kv.get(&sub_key(HASH, &a[1], &a[2]))?.is_some() as i64))
}

pub fn hincrby(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let by = int_arg(&a[3])?;
    let mut count = hash_count(kv, &a[1])?;
    let fk = sub_key(HASH, &a[1], &a[2]);
    let cur = match kv.get(&fk)? {
        None => {
            count += 1;
            0
        }
        Some(v) => crate::num::parse_i64(&v).map_or_else(|| fail("ERR hash value is not an integer"), Ok)?,
    };
    let Some(n) = cur.checked_add(by) else {
        return fail(OVERFLOW);
    };
    kv.put(&fk, n.to_string().as_bytes())?;
    store_count(kv, &a[1], count)?;
    Ok(Reply::Int(n))
}
