//! What recovery and `check` read from an isle leaf: the scan that finds
//! its live pairs (dropping the copies a crash inside a move left, and the
//! pairs a split in place moved on), and the audit of its invariants.

use super::*;
use crate::format::{header, validate};

pub(super) fn scan<S: Space>(s: &S, off: u64, _committed: u64) -> std::result::Result<Scan, String> {
    // Everything read below (the codes, the successor's `low` a STALE
    // link names, every slot a code names with its blob) is checked
    // first: the leaf comes from media that may be damaged.
    let data_start = header::data_start(s);
    let size = validate::isle_leaf(s, off, data_start).map_err(|d| d.what)?;
    let all = all_slots(s, off, size);
    let max_version = all
        .iter()
        .filter_map(|(_, x)| Meta::decode(x.words[3]))
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
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

pub(super) fn audit<S: Space>(s: &S, leaf: &Leaf<Isle>, ctx: &AuditCtx<'_>) -> Audit {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::SimSpace;

    const POOL: u64 = 64 * 1024;
    const DATA: u64 = 4096;
    const LEAF: u64 = DATA;
    const SIZE: u64 = 640;
    const BLOB: u64 = DATA + 8192;
    const LONG: &[u8] = b"b-long-key-kept-in-a-blob";

    fn slot(key: &[u8], value: &[u8], blob: u64) -> Slot {
        Slot {
            words: element::encode(key, value, blob, 3, false),
            long_key: (key.len() > 8).then(|| key.into()),
            settled: false,
        }
    }

    /// A pool header and one isle leaf holding two compact pairs (line 0)
    /// and two general ones (line 1), one of them with its key in a blob.
    fn pool() -> SimSpace {
        let s = SimSpace::new(POOL);
        s.store(header::pool_size_word(), POOL);
        s.store(header::data_start_word(), DATA);
        element::write_blob(&s, BLOB, LONG, b"v");
        let mut elems = vec![
            slot(b"aaaaaaaa", b"11111111", 0),
            slot(b"cccccccc", b"22222222", 0),
            slot(LONG, b"v", BLOB),
            slot(b"d", b"short", 0),
        ];
        elems.sort_by(|a, b| a.key_cmp(b));
        Isle::build(&s, LEAF, SIZE, 0, &elems);
        s
    }

    /// The general slot holding the long key.
    fn long_slot(s: &SimSpace) -> u64 {
        let lo = il::line(LEAF, SIZE, 1);
        (0..2)
            .map(|slot| il::g_elem(lo, slot))
            .find(|&e| s.load(e + nv::E_BLOB) == BLOB)
            .expect("the long key's slot")
    }

    fn scan_err(s: &SimSpace) -> String {
        match scan(s, LEAF, 0) {
            Ok(sc) => panic!("damaged leaf scanned: {} pairs", sc.live),
            Err(e) => e,
        }
    }

    #[test]
    fn sound_leaf_scans() {
        let s = pool();
        let sc = scan(&s, LEAF, 0).unwrap();
        assert_eq!((sc.size, sc.live), (SIZE, 4));
        assert_eq!(sc.blobs, vec![BLOB]);
        assert_eq!(sc.max_version, 3);
        assert_eq!(Isle::count(&s, LEAF), 4);
    }

    #[test]
    fn invalid_line_code() {
        let s = pool();
        let w = il::code_word(LEAF, 0);
        s.store(w, with_code(s.load(w), LEAF, 0, 0xff));
        assert!(scan_err(&s).contains("invalid code"));
    }

    #[test]
    fn invalid_metadata_of_a_long_key() {
        // The scan once loaded the key before checking the metadata.
        let s = pool();
        s.store(long_slot(&s) + nv::E_META, 9 << 56);
        assert!(scan_err(&s).contains("invalid metadata"));
    }

    #[test]
    fn long_key_blob_outside_the_pool() {
        let s = pool();
        let e = long_slot(&s);
        s.store(e + nv::E_BLOB, 1 << 40);
        assert!(scan_err(&s).contains("invalid blob reference"));
        s.store(e + nv::E_BLOB, BLOB);
        s.store(BLOB, crate::format::blob::header_word(1 << 30, 0));
        assert!(scan_err(&s).contains("do not match") || scan_err(&s).contains("overruns"));
    }

    #[test]
    fn size_word_beyond_the_pool() {
        let s = pool();
        for size in [1 << 62, u64::MAX, POOL, 0, 64, SIZE + 8] {
            s.store(IsleLeaf::at(LEAF).size_word(), size);
            assert!(scan_err(&s).contains("invalid size"), "size {size}");
            // What an instant open asks for before validating: no panic, no long loop.
            assert_eq!(Isle::count(&s, LEAF), u64::MAX, "size {size}");
        }
    }

    #[test]
    fn stale_link_outside_the_pool() {
        let s = pool();
        for next in [
            (1 << 40) | il::STALE,
            (LEAF + 8) | il::STALE,
            LEAF | il::STALE,
            64 | il::STALE,
        ] {
            s.store(IsleLeaf::at(LEAF).next_word(), next);
            assert!(scan_err(&s).contains("links to invalid"), "next {next:#x}");
            // The dead bound it names is not followed outside the pool.
            assert!(Isle::count(&s, LEAF) <= 4);
        }
        // A STALE link to a sound successor drops the pairs at or above its low.
        let succ = DATA + 2048;
        Isle::build_with_low(&s, succ, SIZE, 0, &[], nv::key_word(b"cccccccc"));
        s.store(IsleLeaf::at(LEAF).next_word(), succ | il::STALE);
        let sc = scan(&s, LEAF, 0).unwrap();
        assert_eq!(sc.live, 2, "pairs below the successor's low");
    }

    #[test]
    fn read_only_view_without_leaves() {
        // A read-only open of a pool whose leaf chain is empty routes to
        // a handle of size 0: reading it reads no codes.
        let s = pool();
        let empty = Leaf::<Isle>::with(0, 0, 0);
        assert_eq!(Isle::read(&s, &empty, b"aaaaaaaa", u64::MAX), Some(None));
        assert_eq!(Isle::count(&s, 0), u64::MAX);
    }
}
