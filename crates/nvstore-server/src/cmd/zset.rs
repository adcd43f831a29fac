//! Sorted-set commands. A member is two keys: `'z' len(key) key member` →
//! score (8 bytes) for lookups by member and lexicographic ranges, and
//! `'Z' len(key) key score8 member` → empty, the score index, in (score,
//! member) order for ranks and score ranges. Both change in one transaction,
//! together with the metadata (member count).

use std::ops::Bound;

use bytes::Bytes;

use super::{eq, fail, float_arg, int_arg, meta, prefix_scan, CmdError, CmdResult, Cx, SYNTAX, WRONGTYPE};
use crate::keys::{self, meta_key, score_from_bytes, score_key, sub_key, sub_prefix, Meta, ZMEMBER, ZSCORE};
use crate::resp::Reply;
use crate::store::Kv;

fn zcard_of(kv: &dyn Kv, key: &[u8]) -> Result<u64, CmdError> {
    match meta(kv, key)? {
        None => Ok(0),
        Some(Meta::ZSet { count }) => Ok(count),
        Some(_) => fail(WRONGTYPE),
    }
}

fn store_count(kv: &mut dyn Kv, key: &[u8], count: u64) -> Result<(), CmdError> {
    if count == 0 {
        kv.delete(&meta_key(key))?;
    } else {
        kv.put(&meta_key(key), &Meta::ZSet { count }.encode())?;
    }
    Ok(())
}

fn member_score(kv: &dyn Kv, key: &[u8], member: &[u8]) -> Result<Option<f64>, CmdError> {
    Ok(kv.get(&sub_key(ZMEMBER, key, member))?.map(|v| score_from_bytes(&v)))
}

fn put_member(kv: &mut dyn Kv, key: &[u8], member: &[u8], old: Option<f64>, new: f64) -> Result<(), CmdError> {
    if let Some(o) = old {
        kv.delete(&score_key(key, o, member))?;
    }
    let new = if new == 0.0 { 0.0 } else { new };
    kv.put(&sub_key(ZMEMBER, key, member), &keys::score_bytes(new))?;
    kv.put(&score_key(key, new, member), b"")?;
    Ok(())
}

#[derive(Default, Clone, Copy)]
struct AddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]
pub fn zadd(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut f = AddFlags::default();
    let mut i = 2;
    while i < a.len() {
        let o = &a[i];
        if eq(o, "nx") {
            f.nx = true;
        } else if eq(o, "xx") {
            f.xx = true;
        } else if eq(o, "gt") {
            f.gt = true;
        } else if eq(o, "lt") {
            f.lt = true;
        } else if eq(o, "ch") {
            f.ch = true;
        } else if eq(o, "incr") {
            f.incr = true;
        } else {
            break;
        }
        i += 1;
    }
    let rest = &a[i..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return fail(SYNTAX);
    }
    if f.nx && f.xx {
        return fail("ERR XX and NX options at the same time are not compatible");
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        return fail("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if f.incr && rest.len() > 2 {
        return fail("ERR INCR option supports a single increment-element pair");
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for p in rest.chunks(2) {
        pairs.push((float_arg(&p[0])?, &p[1]));
    }
    zadd_pairs(kv, &a[1], f, &pairs)
}

fn zadd_pairs(kv: &mut dyn Kv, key: &[u8], f: AddFlags, pairs: &[(f64, &Bytes)]) -> CmdResult {
    let mut count = zcard_of(kv, key)?;
    let (mut added, mut changed) = (0, 0);
    let mut last: Option<f64> = None;
    for &(score, member) in pairs {
        let old = member_score(kv, key, member)?;
        match old {
            Some(o) => {
                if f.nx {
                    last = None;
                    continue;
                }
                let new = if f.incr { o + score } else { score };
                if new.is_nan() {
                    return fail("ERR resulting score is not a number (NaN)");
                }
                if (f.gt && new <= o) || (f.lt && new >= o) {
                    last = None;
                    continue;
                }
                if new != o {
                    put_member(kv, key, member, Some(o), new)?;
                    changed += 1;
                }
                last = Some(new);
            }
            None => {
                if f.xx {
                    last = None;
                    continue;
                }
                put_member(kv, key, member, None, score)?;
                added += 1;
                count += 1;
                last = Some(score);
            }
        }
    }
    if added + changed > 0 {
        store_count(kv, key, count)?;
    }
    if f.incr {
        return Ok(last.map_or(Reply::Nil, Reply::Double));
    }
    Ok(Reply::Int(if f.ch { added + changed } else { added }))
}

pub fn zincrby(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let by = float_arg(&a[2])?;
    let f = AddFlags {
        incr: true,
        ..Default::default()
    };
    zadd_pairs(kv, &a[1], f, &[(by, &a[3])])
}

pub fn zrem(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let mut count = zcard_of(kv, &a[1])?;
    let mut removed = 0;
    for m in &a[2..] {
        if count == 0 {
            break;
        }
        if let Some(s) = member_score(kv, &a[1], m)? {
            kv.delete(&sub_key(ZMEMBER, &a[1], m))?;
            kv.delete(&score_key(&a[1], s, m))?;
            removed += 1;
            count -= 1;
        }
    }
    if removed > 0 {
        store_count(kv, &a[1], count)?;
    }
    Ok(Reply::Int(removed))
}

pub fn zscore(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    if zcard_of(kv, &a[1])? == 0 {
        return Ok(Reply::Nil);
    }
    Ok(member_score(kv, &a[1], &a[2])?.map_or(Reply::Nil, Reply::Double))
}

pub fn zcard(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(zcard_of(kv, &a[1])? as i64))
}

/// A score bound: `1.5`, `(1.5` (exclusive), `-inf`, `+inf`.
#[derive(Clone, Copy, Debug)]
struct ScoreBound {
    v: f64,
    excl: bool,
}

fn score_bound(b: &[u8]) -> Result<ScoreBound, CmdError> {
    let (excl, s) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    match crate::num::parse_f64(s) {
        Some(v) => Ok(ScoreBound { v, excl }),
        None => fail("ERR min or max is not a float"),
    }
}

impl ScoreBound {
    fn below(&self, x: f64) -> bool {
        // self is a minimum: x is at or above it
        if self.excl {
            x > self.v
        } else {
            x >= self.v
        }
    }
    fn above(&self, x: f64) -> bool {
        if self.excl {
            x < self.v
        } else {
            x <= self.v
        }
    }
}

/// A lexicographic bound: `-`, `+`, `[x`, `(x`.
#[derive(Clone, Debug)]
enum LexBound {
    NegInf,
    PosInf,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

fn lex_bound(b: &[u8]) -> Result<LexBound, CmdError> {
    match b.first() {
        Some(b'-') if b.len() == 1 => Ok(LexBound::NegInf),
        Some(b'+') if b.len() == 1 => Ok(LexBound::PosInf),
        Some(b'[') => Ok(LexBound::Incl(b[1..].to_vec())),
        Some(b'(') => Ok(LexBound::Excl(b[1..].to_vec())),
        _ => fail("ERR min or max not valid string range item"),
    }
}

/// (score, member) pairs with scores in `[min, max]` (bounds may be exclusive).
fn by_score<'a>(
    kv: &'a dyn Kv,
    key: &[u8],
    min: ScoreBound,
    max: ScoreBound,
    rev: bool,
) -> Box<dyn Iterator<Item = (f64, Vec<u8>)> + 'a> {
    if min.v > max.v {
        return Box::new(std::iter::empty());
    }
    let sp = sub_prefix(ZSCORE, key);
    let mut lo = sp.clone();
    lo.extend_from_slice(&keys::score_bytes(min.v));
    let mut hi = sp.clone();
    hi.extend_from_slice(&keys::score_bytes(max.v));
    let hi = keys::prefix_end(&hi).expect("score keys start with 'Z'");
    let n = sp.len();
    Box::new(
        kv.scan(Bound::Included(lo), Bound::Excluded(hi), rev)
            .map(move |(k, _)| (score_from_bytes(&k[n..n + 8]), k[n + 8..].to_vec()))
            .filter(move |(s, _)| min.below(*s) && max.above(*s)),
    )
}

/// (score, member) pairs with members in the lexicographic range.
fn by_lex<'a>(
    kv: &'a dyn Kv,
    key: &[u8],
    min: &LexBound,
    max: &LexBound,
    rev: bool,
) -> Box<dyn Iterator<Item = (f64, Vec<u8>)> + 'a> {
    let mp = sub_prefix(ZMEMBER, key);
    let with = |m: &[u8]| {
        let mut k = mp.clone();
        k.extend_from_slice(m);
        k
    };
    let empty = match (min, max) {
        (LexBound::PosInf, _) | (_, LexBound::NegInf) => true,
        (LexBound::Incl(a), LexBound::Incl(b)) => a > b,
        (LexBound::Incl(a) | LexBound::Excl(a), LexBound::Incl(b) | LexBound::Excl(b)) => a >= b,
        _ => false,
    };
    if empty {
        return Box::new(std::iter::empty());
    }
    let lo = match min {
        LexBound::NegInf => Bound::Included(mp.clone()),
        LexBound::Incl(m) => Bound::Included(with(m)),
        LexBound::Excl(m) => Bound::Excluded(with(m)),
        LexBound::PosInf => unreachable!(),
    };
    let hi = match max {
        LexBound::PosInf => Bound::Excluded(keys::prefix_end(&mp).expect("member keys start with 'z'")),
        LexBound::Incl(m) => Bound::Included(with(m)),
        LexBound::Excl(m) => Bound::Excluded(with(m)),
        LexBound::NegInf => unreachable!(),
    };
    let n = mp.len();
    Box::new(
        kv.scan(lo, hi, rev)
            .map(move |(k, v)| (score_from_bytes(&v), k[n..].to_vec())),
    )
}

/// Every (score, member) in score order.
fn all<'a>(kv: &'a dyn Kv, key: &[u8], rev: bool) -> Box<dyn Iterator<Item = (f64, Vec<u8>)> + 'a> {
    let sp = sub_prefix(ZSCORE, key);
    let n = sp.len();
    Box::new(prefix_scan(kv, &sp, rev).map(move |(k, _)| (score_from_bytes(&k[n..n + 8]), k[n + 8..].to_vec())))
}

pub fn zcount(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (min, max) = (score_bound(&a[2])?, score_bound(&a[3])?);
    if zcard_of(kv, &a[1])? == 0 {
        return Ok(Reply::Int(0));
    }
    Ok(Reply::Int(by_score(kv, &a[1], min, max, false).count() as i64))
}

fn rank(kv: &mut dyn Kv, a: &[Bytes], rev: bool) -> CmdResult {
    let withscore = match a.len() {
        3 => false,
        4 if eq(&a[3], "withscore") => true,
        _ => return fail(SYNTAX),
    };
    let card = zcard_of(kv, &a[1])?;
    let missing = if withscore { Reply::NilArray } else { Reply::Nil };
    if card == 0 {
        return Ok(missing);
    }
    let Some(s) = member_score(kv, &a[1], &a[2])? else {
        return Ok(missing);
    };
    let sp = sub_prefix(ZSCORE, &a[1]);
    let before = kv
        .scan(Bound::Included(sp), Bound::Excluded(score_key(&a[1], s, &a[2])), false)
        .count() as i64;
    let r = if rev { card as i64 - 1 - before } else { before };
    Ok(if withscore {
        Reply::Array(vec![Reply::Int(r), Reply::Double(s)])
    } else {
        Reply::Int(r)
    })
}

pub fn zrank(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    rank(kv, a, false)
}

pub fn zrevrank(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    rank(kv, a, true)
}

enum RangeBy {
    Rank(i64, i64),
    Score(ScoreBound, ScoreBound),
    Lex(LexBound, LexBound),
}

struct RangeReq {
    by: RangeBy,
    rev: bool,
    limit: Option<(i64, i64)>,
    withscores: bool,
}

fn run_range(kv: &mut dyn Kv, cx: &Cx, key: &[u8], q: RangeReq) -> CmdResult {
    let card = zcard_of(kv, key)?;
    let mut items: Vec<(f64, Vec<u8>)> = Vec::new();
    if card > 0 {
        let (offset, count) = q.limit.unwrap_or((0, -1));
        if offset >= 0 {
            let take = if count < 0 { usize::MAX } else { count as usize };
            let it: Box<dyn Iterator<Item = (f64, Vec<u8>)>> = match &q.by {
                RangeBy::Rank(s, e) => {
                    let len = card as i64;
                    let s = if *s < 0 { (len + s).max(0) } else { *s };
                    let e = if *e < 0 { len + e } else { (*e).min(len - 1) };
                    if s > e || s >= len {
                        Box::new(std::iter::empty())
                    } else {
                        Box::new(all(kv, key, q.rev).skip(s as usize).take((e - s + 1) as usize))
                    }
                }
                RangeBy::Score(min, max) => by_score(kv, key, *min, *max, q.rev),
                RangeBy::Lex(min, max) => by_lex(kv, key, min, max, q.rev),
            };
            items = it.skip(offset as usize).take(take).collect();
        }
    }
    let reply = if !q.withscores {
        items.into_iter().map(|(_, m)| Reply::Bulk(m)).collect()
    } else if cx.proto >= 3 {
        items
            .into_iter()
            .map(|(s, m)| Reply::Array(vec![Reply::Bulk(m), Reply::Double(s)]))
            .collect()
    } else {
        items
            .into_iter()
            .flat_map(|(s, m)| [Reply::Bulk(m), Reply::Double(s)])
            .collect()
    };
    Ok(Reply::Array(reply))
}

/// Options after the bounds: WITHSCORES, LIMIT o c, and (ZRANGE only) BYSCORE, BYLEX, REV.
struct Opts {
    withscores: bool,
    limit: Option<(i64, i64)>,
    byscore: bool,
    bylex: bool,
    rev: bool,
}

fn parse_opts(a: &[Bytes], full: bool) -> Result<Opts, CmdError> {
    let mut o = Opts {
        withscores: false,
        limit: None,
        byscore: false,
        bylex: false,
        rev: false,
    };
    let mut i = 0;
    while i < a.len() {
        let x = &a[i];
        if eq(x, "withscores") {
            o.withscores = true;
        } else if eq(x, "limit") && i + 2 < a.len() {
            o.limit = Some((int_arg(&a[i + 1])?, int_arg(&a[i + 2])?));
            i += 2;
        } else if full && eq(x, "byscore") {
            o.byscore = true;
        } else if full && eq(x, "bylex") {
            o.bylex = true;
        } else if full && eq(x, "rev") {
            o.rev = true;
        } else {
            return fail(SYNTAX);
        }
        i += 1;
    }
    Ok(o)
}

/// ZRANGE key start stop [BYSCORE | BYLEX] [REV] [LIMIT offset count] [WITHSCORES]
pub fn zrange(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let o = parse_opts(&a[4..], true)?;
    if o.byscore && o.bylex {
        return fail(SYNTAX);
    }
    if o.limit.is_some() && !o.byscore && !o.bylex {
        return fail("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
    }
    if o.withscores && o.bylex {
        return fail("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
    }
    // With REV, BYSCORE/BYLEX take `max min`.
    let (lo, hi) = if o.rev && (o.byscore || o.bylex) {
        (&a[3], &a[2])
    } else {
        (&a[2], &a[3])
    };
    let by = if o.byscore {
        RangeBy::Score(score_bound(lo)?, score_bound(hi)?)
    } else if o.bylex {
        RangeBy::Lex(lex_bound(lo)?, lex_bound(hi)?)
    } else {
        RangeBy::Rank(int_arg(&a[2])?, int_arg(&a[3])?)
    };
    let q = RangeReq {
        by,
        rev: o.rev,
        limit: o.limit,
        withscores: o.withscores,
    };
    run_range(kv, cx, &a[1], q)
}

pub fn zrevrange(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let o = parse_opts(&a[4..], false)?;
    if o.limit.is_some() {
        return fail(SYNTAX);
    }
    let by = RangeBy::Rank(int_arg(&a[2])?, int_arg(&a[3])?);
    run_range(
        kv,
        cx,
        &a[1],
        RangeReq {
            by,
            rev: true,
            limit: None,
            withscores: o.withscores,
        },
    )
}

fn by_score_cmd(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes], rev: bool) -> CmdResult {
    let o = parse_opts(&a[4..], false)?;
    let (lo, hi) = if rev { (&a[3], &a[2]) } else { (&a[2], &a[3]) };
    let by = RangeBy::Score(score_bound(lo)?, score_bound(hi)?);
    run_range(
        kv,
        cx,
        &a[1],
        RangeReq {
            by,
            rev,
            limit: o.limit,
            withscores: o.withscores,
        },
    )
}

pub fn zrangebyscore(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    by_score_cmd(kv, cx, a, false)
}

pub fn zrevrangebyscore(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    by_score_cmd(kv, cx, a, true)
}

fn by_lex_cmd(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes], rev: bool) -> CmdResult {
    let o = parse_opts(&a[4..], false)?;
    if o.withscores {
        return fail(SYNTAX);
    }
    let (lo, hi) = if rev { (&a[3], &a[2]) } else { (&a[2], &a[3]) };
    let by = RangeBy::Lex(lex_bound(lo)?, lex_bound(hi)?);
    run_range(
        kv,
        cx,
        &a[1],
        RangeReq {
            by,
            rev,
            limit: o.limit,
            withscores: false,
        },
    )
}

pub fn zrangebylex(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    by_lex_cmd(kv, cx, a, false)
}

pub fn zrevrangebylex(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    by_lex_cmd(kv, cx, a, true)
}
