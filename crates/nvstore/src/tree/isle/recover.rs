//! What recovery and `check` read from an isle leaf: the scan that finds
//! its live pairs (dropping the copies a crash inside a move left, and the
//! pairs a split in place moved on), and the audit of its invariants.

use super::*;

pub(super) fn scan<S: Space>(s: &S, off: u64, _committed: u64) -> std::result::Result<Scan, String> {
    let pool = crate::format::header::pool_size(s);
    let size = Isle::size(s, off);
    if size < il::MIN_SIZE || size % LINE != 0 || size > pool - off {
        return Err(format!("leaf {off} has invalid size {size}"));
    }
    let cs = codes(s, off, size);
    if let Some(line) = cs.iter().position(|&c| !il::valid(c)) {
        return Err(format!("leaf {off} line {line} has invalid code {:#x}", cs[line]));
    }
    let all = all_slots(s, off, size);
    let mut max_version = 0;
    for (loc, x) in &all {
        let meta = Meta::decode(x.words[3])
            .ok_or_else(|| format!("leaf {off} line {} has invalid metadata {:#x}", loc.line, x.words[3]))?;
        if meta.negative || meta.txn {
            return Err(format!("leaf {off} line {} holds a NEGATIVE or TXN element", loc.line));
        }
        if meta.needs_blob() {
            element::validate_blob(s, x.blob(), meta, pool)
                .map_err(|w| format!("leaf {off} line {}: {w}", loc.line))?;
        } else if x.blob() != 0 {
            return Err(format!(
                "leaf {off} line {} has a blob reference but inline data",
                loc.line
            ));
        }
        max_version = max_version.max(meta.version);
    }
    let losers = losers(&all);
    let winners: Vec<&Slot> = all
        .iter()
        .filter(|(l, _)| !losers.contains(l))
        .map(|(_, x)| x)
        .collect();
    if s.writable() {
        // Make the codes say what the leaf holds: drop the pairs a split
        // in place moved on (a crash came between its link and its
        // codes) and the older copy a move between code words left.
        let bound = dead_bound(s, off);
        let mut gone: HashMap<u64, Vec<u8>> = HashMap::new();
        for loc in &losers {
            gone.entry(loc.line).or_default().push(loc.slot);
        }
        let cs = codes(s, off, size);
        let mut changed = false;
        let mut stale = false;
        for (line, &c) in cs.iter().enumerate() {
            let line = line as u64;
            let mut code = live_code(s, il::line(off, size, line), c, bound);
            stale |= code != c;
            if let Some(g) = gone.get(&line) {
                code = without(code, |x| g.contains(&x));
            }
            if code != c {
                let w = il::code_word(off, line);
                s.store(w, with_code(s.load(w), off, line, code));
                s.flush(w, 8, points::ISLE_CODE_FLUSH);
                changed = true;
            }
        }
        if changed {
            s.fence(points::ISLE_CODE_FENCE);
        }
        if stale {
            STALE_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        if !losers.is_empty() {
            DUPLICATES_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
    let blobs: Vec<u64> = winners.iter().map(|x| x.blob()).filter(|&b| b != 0).collect();
    let max = winners.iter().max_by(|a, b| a.key_cmp(b)).map(|x| x.key());
    Ok(Scan {
        size,
        count: winners.len() as u64,
        undo: false,
        max,
        max_version,
        live: winners.len() as u64,
        blobs,
    })
}

pub(super) fn audit<S: Space>(s: &S, leaf: &LeafRef, ctx: &AuditCtx<'_>) -> Audit {
    let off = leaf.off;
    let mut a = Audit::default();
    let cs = codes(s, off, leaf.size);
    let h = il::header_lines(leaf.size);
    let bound = dead_bound(s, off);
    // Per key, the rank and blob of the copy that counts (see `losers`).
    let mut seen: HashMap<Vec<u8>, ((bool, u64), u64)> = HashMap::new();
    for (line, &c) in cs.iter().enumerate() {
        if !il::valid(c) {
            a.problems.push(format!("leaf {off} line {line}: invalid code {c:#x}"));
            continue;
        }
        // Pairs a split moved on are not this leaf's (a read-only open
        // after a crash may still list them).
        let code = il::decode(live_code(s, il::line(off, leaf.size, line as u64), c, bound));
        let mut prev: Option<Slot> = None;
        for &slot in code.live() {
            let loc = Loc {
                line: line as u64,
                slot,
                kind: code.kind,
            };
            let words = words_at(s, off, leaf.size, loc);
            if let Err(w) = element::leaf_blob_ok(s, &words, ctx.pool) {
                a.problems.push(format!("leaf {off} line {line} slot {slot}: {w}"));
                continue;
            }
            let meta = Meta::decode(words[3]).expect("checked by leaf_blob_ok");
            if meta.negative || meta.txn {
                a.problems
                    .push(format!("leaf {off} line {line} slot {slot}: NEGATIVE or TXN element"));
            }
            if meta.version > ctx.last_ts {
                a.problems.push(format!(
                    "leaf {off} line {line} slot {slot}: version {} is newer than the clock ({})",
                    meta.version, ctx.last_ts
                ));
            }
            let x = Slot {
                settled: false,
                long_key: meta
                    .key_inline
                    .is_none()
                    .then(|| element::element_key(s, &words).into_boxed_slice()),
                words,
            };
            if prev.as_ref().is_some_and(|p| p.key_cmp(&x) != Cmp::Less) {
                a.problems.push(format!(
                    "leaf {off} line {line} (at {}): keys out of order",
                    off + (h + line as u64) * LINE
                ));
            }
            let key = x.key();
            if !(ctx.in_bounds)(&key) {
                a.problems.push(format!(
                    "leaf {off} line {line} slot {slot}: key {} outside the leaf's bounds",
                    leaf::show(&key)
                ));
            }
            let copy = (copy_rank(code.kind, &x.words), x.blob());
            match seen.entry(key) {
                Entry::Vacant(v) => {
                    v.insert(copy);
                    a.elements += 1;
                }
                // A read-only open after a crash inside a move between
                // code words still lists both copies; recovery keeps one
                // and frees the other's blob, and so do reads.
                Entry::Occupied(mut o) if !s.writable() => {
                    if copy.0 > o.get().0 {
                        o.insert(copy);
                    }
                }
                Entry::Occupied(o) => {
                    a.problems
                        .push(format!("leaf {off}: key {} is live twice", leaf::show(o.key())));
                    if x.blob() != 0 {
                        a.blobs.push(x.blob());
                    }
                    a.elements += 1;
                }
            }
            prev = Some(x);
        }
    }
    a.blobs.extend(seen.values().map(|&(_, b)| b).filter(|&b| b != 0));
    a.live = seen.len() as u64;
    let durable = leaf.durable.load(Ordering::Relaxed);
    if durable != a.live {
        a.problems.push(format!(
            "leaf {off}: DRAM pair count {durable} differs from the {} live pairs",
            a.live
        ));
    }
    a
}

/// Which of two copies of one key wins: general over compact, then the
/// newer version (on a tie, the one met first in line order).
pub(super) fn copy_rank(kind: Kind, words: &[u64; 4]) -> (bool, u64) {
    (kind == Kind::General, words[3] & nv::VERSION_MASK)
}

/// The locations of the copies of a key that lose to another copy (left
/// by a crash inside a move between code words): general beats compact,
/// then the newer version wins; on a tie, the copy met first.
pub(super) fn losers(all: &[(Loc, Slot)]) -> Vec<Loc> {
    let mut best: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut out = Vec::new();
    for (j, (loc, x)) in all.iter().enumerate() {
        match best.entry(x.key()) {
            Entry::Vacant(v) => {
                v.insert(j);
            }
            Entry::Occupied(mut o) => {
                let (cur_loc, cur) = &all[*o.get()];
                if copy_rank(loc.kind, &x.words) > copy_rank(cur_loc.kind, &cur.words) {
                    out.push(*cur_loc);
                    o.insert(j);
                } else {
                    out.push(*loc);
                }
            }
        }
    }
    out
}
