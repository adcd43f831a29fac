//! Sorted-set commands, over two layouts (see `keys.rs`):
//!
//! - **small** (the default for new sorted sets): every (score, member) in
//!   the metadata value itself, in (score, member) order, as Redis keeps
//!   small sorted sets in one listpack. A read is one point read and a
//!   write one single-key write, which the engine commits in one leaf with
//!   one count store (atomic across crashes, no commit record).
//! - **large**: a member is two keys, `'z' len(key) key member` → score
//!   (8 bytes) for lookups by member and lexicographic ranges, and
//!   `'Z' len(key) key score8 member` → empty, the score index, in (score,
//!   member) order for ranks and score ranges. Both change in one
//!   transaction together with the metadata (member count), which every
//!   write rewrites (so a WATCH on the key sees member changes).
//!
//! A small sorted set that outgrows its [`CompactLimits`] moves to the
//! large layout inside the transaction of the write that outgrew it, so a
//! crash leaves it before or after that write, never between layouts.
//! Large sorted sets stay large, and pools written before small sorted
//! sets existed read as they are.

use std::ops::Bound;

use bytes::Bytes;

use super::{eq, fail, float_arg, int_arg, meta, prefix_scan, CmdError, CmdResult, Cx, SYNTAX, WRONGTYPE};
use crate::keys::{
    self, meta_key, score_from_bytes, score_key, sub_key, sub_prefix, zset_order, CompactLimits, Meta, ZMEMBER, ZSCORE,
};
use crate::resp::Reply;
use crate::store::Kv;

/// (score, member) of a small sorted set, in (score, member) order.
type Items = Vec<(f64, Vec<u8>)>;

/// A sorted set as its metadata says it is stored (an absent one is an
/// empty small one: a first write creates it small).
enum ZSet {
    Small(Items),
    Large { count: u64 },
}

impl ZSet {
    /// Sorted set `key`; WRONGTYPE for another type.
    fn load(kv: &dyn Kv, key: &[u8]) -> Result<ZSet, CmdError> {
        match meta(kv, key)? {
            None => Ok(ZSet::Small(Vec::new())),
            Some(Meta::SmallZSet(items)) => Ok(ZSet::Small(items)),
            Some(Meta::ZSet { count }) => Ok(ZSet::Large { count }),
            Some(_) => fail(WRONGTYPE),
        }
    }

    fn len(&self) -> u64 {
        match self {
            ZSet::Small(items) => items.len() as u64,
            ZSet::Large { count } => *count,
        }
    }

    fn score(&self, kv: &dyn Kv, key: &[u8], member: &[u8]) -> Result<Option<f64>, CmdError> {
        match self {
            ZSet::Small(items) => Ok(items.iter().find(|(_, m)| m == member).map(|(s, _)| *s)),
            ZSet::Large { .. } => Ok(kv.get(&sub_key(ZMEMBER, key, member))?.map(|v| score_from_bytes(&v))),
        }
    }

    /// Gives `member` (whose score is `old`) the score `new`.
    fn set(&mut self, kv: &mut dyn Kv, key: &[u8], member: &[u8], old: Option<f64>, new: f64) -> Result<(), CmdError> {
        let new = if new == 0.0 { 0.0 } else { new };
        match self {
            ZSet::Small(items) => {
                if old.is_some() {
                    items.retain(|(_, m)| m != member);
                }
                let item = (new, member.to_vec());
                let at = items.partition_point(|x| zset_order(x, &item).is_lt());
                items.insert(at, item);
            }
            ZSet::Large { count } => {
                match old {
                    Some(o) => kv.delete(&score_key(key, o, member))?,
                    None => *count += 1,
                }
                kv.put(&sub_key(ZMEMBER, key, member), &keys::score_bytes(new))?;
                kv.put(&score_key(key, new, member), b"")?;
            }
        }
        Ok(())
    }

    /// Removes `member`, whose score is `old`.
    fn remove(&mut self, kv: &mut dyn Kv, key: &[u8], member: &[u8], old: f64) -> Result<(), CmdError> {
        match self {
            ZSet::Small(items) => items.retain(|(_, m)| m != member),
            ZSet::Large { count } => {
                kv.delete(&sub_key(ZMEMBER, key, member))?;
                kv.delete(&score_key(key, old, member))?;
                *count -= 1;
            }
        }
        Ok(())
    }

    /// Writes the metadata after a change: a small set compactly if it
    /// still fits `lim`, else moved to one key pair per member (in the
    /// caller's transaction); an empty set is deleted.
    fn store(self, kv: &mut dyn Kv, key: &[u8], lim: &CompactLimits) -> Result<(), CmdError> {
        match self {
            ZSet::Small(items) if items.is_empty() => kv.delete(&meta_key(key))?,
            ZSet::Small(items) if lim.fits_zset(&items) => kv.put(&meta_key(key), &Meta::SmallZSet(items).encode())?,
            ZSet::Small(items) => {
                for (s, m) in &items {
                    kv.put(&sub_key(ZMEMBER, key, m), &keys::score_bytes(*s))?;
                    kv.put(&score_key(key, *s, m), b"")?;
                }
                let count = items.len() as u64;
                kv.put(&meta_key(key), &Meta::ZSet { count }.encode())?;
            }
            ZSet::Large { count: 0 } => kv.delete(&meta_key(key))?,
            ZSet::Large { count } => kv.put(&meta_key(key), &Meta::ZSet { count }.encode())?,
        }
        Ok(())
    }
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
pub fn zadd(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
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
    zadd_pairs(kv, cx, &a[1], f, &pairs)
}

fn zadd_pairs(kv: &mut dyn Kv, cx: &Cx, key: &[u8], f: AddFlags, pairs: &[(f64, &Bytes)]) -> CmdResult {
    let mut z = ZSet::load(kv, key)?;
    let (mut added, mut changed) = (0, 0);
    let mut last: Option<f64> = None;
    for &(score, member) in pairs {
        let old = z.score(kv, key, member)?;
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
                    z.set(kv, key, member, Some(o), new)?;
                    changed += 1;
                }
                last = Some(new);
            }
            None => {
                if f.xx {
                    last = None;
                    continue;
                }
                z.set(kv, key, member, None, score)?;
                added += 1;
                last = Some(score);
            }
        }
    }
    if added + changed > 0 {
        z.store(kv, key, &cx.sh.cfg.zcompact)?;
    }
    if f.incr {
        return Ok(last.map_or(Reply::Nil, Reply::Double));
    }
    Ok(Reply::Int(if f.ch { added + changed } else { added }))
}

pub fn zincrby(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let by = float_arg(&a[2])?;
    let f = AddFlags {
        incr: true,
        ..Default::default()
    };
    zadd_pairs(kv, cx, &a[1], f, &[(by, &a[3])])
}

pub fn zrem(kv: &mut dyn Kv, cx: &Cx, a: &[Bytes]) -> CmdResult {
    let mut z = ZSet::load(kv, &a[1])?;
    let mut removed = 0;
    for m in &a[2..] {
        if z.len() == 0 {
            break;
        }
        if let Some(s) = z.score(kv, &a[1], m)? {
            z.remove(kv, &a[1], m, s)?;
            removed += 1;
        }
    }
    if removed > 0 {
        z.store(kv, &a[1], &cx.sh.cfg.zcompact)?;
    }
    Ok(Reply::Int(removed))
}

pub fn zscore(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let z = ZSet::load(kv, &a[1])?;
    if z.len() == 0 {
        return Ok(Reply::Nil);
    }
    Ok(z.score(kv, &a[1], &a[2])?.map_or(Reply::Nil, Reply::Double))
}

pub fn zcard(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    Ok(Reply::Int(ZSet::load(kv, &a[1])?.len() as i64))
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

impl LexBound {
    /// Whether `m` is at or above this bound as a minimum.
    fn below(&self, m: &[u8]) -> bool {
        match self {
            LexBound::NegInf => true,
            LexBound::PosInf => false,
            LexBound::Incl(x) => m >= x.as_slice(),
            LexBound::Excl(x) => m > x.as_slice(),
        }
    }
    /// Whether `m` is at or below this bound as a maximum.
    fn above(&self, m: &[u8]) -> bool {
        match self {
            LexBound::NegInf => false,
            LexBound::PosInf => true,
            LexBound::Incl(x) => m <= x.as_slice(),
            LexBound::Excl(x) => m < x.as_slice(),
        }
    }
}

/// A (score, member) stream of a sorted set, in the order asked for.
type Members<'a> = Box<dyn Iterator<Item = (f64, Vec<u8>)> + 'a>;

/// `it` forwards or backwards, members copied out.
fn small_iter<'a>(it: impl DoubleEndedIterator<Item = &'a (f64, Vec<u8>)> + 'a, rev: bool) -> Members<'a> {
    let it = it.map(|(s, m)| (*s, m.clone()));
    if rev {
        Box::new(it.rev())
    } else {
        Box::new(it)
    }
}

/// (score, member) pairs with scores in `[min, max]` (bounds may be exclusive).
fn by_score<'a>(kv: &'a dyn Kv, z: &'a ZSet, key: &[u8], min: ScoreBound, max: ScoreBound, rev: bool) -> Members<'a> {
    if min.v > max.v {
        return Box::new(std::iter::empty());
    }
    if let ZSet::Small(items) = z {
        return small_iter(items.iter().filter(move |(s, _)| min.below(*s) && max.above(*s)), rev);
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

/// (score, member) pairs with members in the lexicographic range, in
/// member order (the order of the `'z'` keys, whatever the scores).
fn by_lex<'a>(kv: &'a dyn Kv, z: &'a ZSet, key: &[u8], min: &LexBound, max: &LexBound, rev: bool) -> Members<'a> {
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
    if let ZSet::Small(items) = z {
        let mut hit: Vec<&(f64, Vec<u8>)> = items.iter().filter(|(_, m)| min.below(m) && max.above(m)).collect();
        hit.sort_unstable_by(|a, b| a.1.cmp(&b.1));
        return small_iter(hit.into_iter(), rev);
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
fn all<'a>(kv: &'a dyn Kv, z: &'a ZSet, key: &[u8], rev: bool) -> Members<'a> {
    if let ZSet::Small(items) = z {
        return small_iter(items.iter(), rev);
    }
    let sp = sub_prefix(ZSCORE, key);
    let n = sp.len();
    Box::new(prefix_scan(kv, &sp, rev).map(move |(k, _)| (score_from_bytes(&k[n..n + 8]), k[n + 8..].to_vec())))
}

pub fn zcount(kv: &mut dyn Kv, _: &Cx, a: &[Bytes]) -> CmdResult {
    let (min, max) = (score_bound(&a[2])?, score_bound(&a[3])?);
    let z = ZSet::load(kv, &a[1])?;
    if z.len() == 0 {
        return Ok(Reply::Int(0));
    }
    Ok(Reply::Int(by_score(kv, &z, &a[1], min, max, false).count() as i64))
}

fn rank(kv: &mut dyn Kv, a: &[Bytes], rev: bool) -> CmdResult {
    let withscore = match a.len() {
        3 => false,
        4 if eq(&a[3], "withscore") => true,
        _ => return fail(SYNTAX),
    };
    let z = ZSet::load(kv, &a[1])?;
    let card = z.len();
    let missing = if withscore { Reply::NilArray } else { Reply::Nil };
    if card == 0 {
        return Ok(missing);
    }
    // (score, members before it in score order)
    let found = match &z {
        ZSet::Small(items) => items
            .iter()
            .position(|(_, m)| m == &a[2])
            .map(|i| (items[i].0, i as i64)),
        ZSet::Large { .. } => z.score(kv, &a[1], &a[2])?.map(|s| {
            let sp = sub_prefix(ZSCORE, &a[1]);
            let n = kv
                .scan(Bound::Included(sp), Bound::Excluded(score_key(&a[1], s, &a[2])), false)
                .count();
            (s, n as i64)
        }),
    };
    let Some((s, before)) = found else {
        return Ok(missing);
    };
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
    let z = ZSet::load(kv, key)?;
    let card = z.len();
    let mut items: Vec<(f64, Vec<u8>)> = Vec::new();
    if card > 0 {
        let (offset, count) = q.limit.unwrap_or((0, -1));
        if offset >= 0 {
            let take = if count < 0 { usize::MAX } else { count as usize };
            let it: Members<'_> = match &q.by {
                RangeBy::Rank(s, e) => {
                    let len = card as i64;
                    let s = if *s < 0 { (len + s).max(0) } else { *s };
                    let e = if *e < 0 { len + e } else { (*e).min(len - 1) };
                    if s > e || s >= len {
                        Box::new(std::iter::empty())
                    } else {
                        Box::new(all(kv, &z, key, q.rev).skip(s as usize).take((e - s + 1) as usize))
                    }
                }
                RangeBy::Score(min, max) => by_score(kv, &z, key, *min, *max, q.rev),
                RangeBy::Lex(min, max) => by_lex(kv, &z, key, min, max, q.rev),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::cmd::fast::tests::{args, below, shared};
    use crate::cmd::{execute, Conn};
    use crate::keys::{meta_key, CompactLimits, Meta};
    use crate::resp::Reply;
    use crate::Config;

    fn small(sh: &std::sync::Arc<crate::shared::Shared>, key: &str) -> Option<bool> {
        let v = sh.store.db().get(&meta_key(key.as_bytes())).unwrap()?;
        match Meta::decode(v) {
            Some(Meta::SmallZSet(_)) => Some(true),
            Some(Meta::ZSet { .. }) => Some(false),
            m => panic!("{key}: {m:?}"),
        }
    }

    /// ZADD, ZINCRBY and ZREM on sets that start small and grow past the
    /// limits answer and store what a map does, read back by rank, score
    /// and member ranges; a set is small exactly while it fits, until it
    /// first outgrows the limits, and large for good after that.
    #[test]
    fn writes_and_ranges_match_a_map_across_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let lim = CompactLimits {
            entries: 6,
            value: 4,
            bytes: 100,
        };
        let cfg = Config {
            zcompact: lim,
            ..Config::default()
        };
        let sh = shared(&dir, cfg);
        let mut c = Conn::new(1, true);
        let mut next = below(0x2545_f491_4f6c_dd1du64);
        let run = |c: &mut Conn, w: &[String]| {
            let words: Vec<&str> = w.iter().map(String::as_str).collect();
            execute(&sh, c, args(&words))
        };
        let (mut seen_small, mut seen_large) = (0, 0);
        for key in ["z0", "z1", "z2", "z3", "z4"] {
            // member -> score (small integers: exact in f64 and in text)
            let mut model: BTreeMap<String, i64> = BTreeMap::new();
            let mut was_large = false;
            for _ in 0..30 {
                let member = "m".repeat(1 + next(3) as usize) + &next(3).to_string();
                let score = next(7) as i64 - 3;
                let cmd: Vec<String> = match next(5) {
                    0..=2 => vec!["zadd".into(), key.into(), score.to_string(), member.clone()],
                    3 => vec!["zincrby".into(), key.into(), score.to_string(), member.clone()],
                    _ => vec!["zrem".into(), key.into(), member.clone()],
                };
                let want = match cmd[0].as_str() {
                    "zadd" => Reply::Int(model.insert(member.clone(), score).is_none() as i64),
                    "zincrby" => {
                        let s = model.entry(member.clone()).or_insert(0);
                        *s += score;
                        Reply::Double(*s as f64)
                    }
                    _ => Reply::Int(model.remove(&member).is_some() as i64),
                };
                assert_eq!(run(&mut c, &cmd), want, "{cmd:?}");
                let mut by_score: Vec<(i64, &String)> = model.iter().map(|(m, s)| (*s, m)).collect();
                by_score.sort();
                let flat: Vec<Reply> = by_score
                    .iter()
                    .flat_map(|(s, m)| [Reply::bulk(m.as_bytes()), Reply::Double(*s as f64)])
                    .collect();
                let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                assert_eq!(
                    run(&mut c, &w(&["zrange", key, "0", "-1", "withscores"])),
                    Reply::Array(flat),
                    "{cmd:?}"
                );
                assert_eq!(run(&mut c, &w(&["zcard", key])), Reply::Int(model.len() as i64));
                let mid: Vec<Reply> = by_score
                    .iter()
                    .filter(|(s, _)| (-1..=1).contains(s))
                    .rev()
                    .map(|(_, m)| Reply::bulk(m.as_bytes()))
                    .collect();
                assert_eq!(
                    run(&mut c, &w(&["zrevrangebyscore", key, "1", "-1"])),
                    Reply::Array(mid),
                    "{cmd:?}"
                );
                let lex: Vec<Reply> = model
                    .keys()
                    .filter(|m| m.as_str() > "mm" && m.as_str() <= "mmm2")
                    .map(|m| Reply::bulk(m.as_bytes()))
                    .collect();
                assert_eq!(
                    run(&mut c, &w(&["zrangebylex", key, "(mm", "[mmm2"])),
                    Reply::Array(lex),
                    "{cmd:?}"
                );
                for (r, (s, m)) in by_score.iter().enumerate() {
                    assert_eq!(run(&mut c, &w(&["zrank", key, m])), Reply::Int(r as i64));
                    assert_eq!(
                        run(&mut c, &w(&["zrevrank", key, m])),
                        Reply::Int((by_score.len() - 1 - r) as i64)
                    );
                    assert_eq!(run(&mut c, &w(&["zscore", key, m])), Reply::Double(*s as f64));
                }
                let items: Vec<(f64, Vec<u8>)> = by_score
                    .iter()
                    .map(|(s, m)| (*s as f64, m.as_bytes().to_vec()))
                    .collect();
                match small(&sh, key) {
                    None => {
                        assert!(model.is_empty());
                        was_large = false;
                    }
                    Some(true) => {
                        assert!(lim.fits_zset(&items) && !was_large, "{cmd:?}");
                        seen_small += 1;
                    }
                    Some(false) => {
                        was_large = true;
                        seen_large += 1;
                    }
                }
                if !was_large {
                    assert!(lim.fits_zset(&items) || model.is_empty(), "{cmd:?}");
                }
            }
        }
        assert!(
            seen_small > 30 && seen_large > 30,
            "{seen_small} small, {seen_large} large"
        );
    }
}
