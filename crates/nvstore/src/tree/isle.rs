//! The Isle-Tree leaf (Isle-Tree §IV) behind [`LeafFormat`]; the layout and
//! the reasons for it are in `format/leaf_isle.rs`.
//!
//! Readers take no lock. Writers change published words in place (a code
//! word, a compact value word), so a leaf's sequence word (the format's
//! DRAM `State` in the leaf handle) is odd from just before such a store
//! until it is durable; a reader that saw it odd, or saw it move while it
//! read, reads again. Slots are written only while free, and a slot freed
//! by a delete can be reused only by a later writer, whose code store
//! moves the sequence word: a reader never keeps a torn pair.
//!
//! Elements carry no versions (the paper's leaves have none, and an update
//! overwrites in place): snapshots, transactions and write batches need an
//! nv pool. General slots keep the nv element's version field, filled with
//! the write's timestamp: it orders the two copies a crash can leave when
//! a pair moves between lines whose codes sit in different header words.

use std::cmp::Ordering as Cmp;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ops::Bound as RB;
use std::sync::atomic::{AtomicU64, Ordering};

use super::collate::{Collated, Keep, Slot};
use super::leaf::{
    self, read_stable, write_visible, Audit, AuditCtx, Elem, LeafFormat, Newest, Removed, Scan, ValueRef, Written,
};
use super::mvcc::Clock;
use super::Leaf;
use crate::format::blob;
use crate::format::element;
use crate::format::element::{encode, inline_value_word};
use crate::format::leaf_isle::{self as il, IsleLeaf, Kind};
use crate::format::leaf_nv::{self as nv, Meta};
use crate::pmem::{points, Space, LINE};

/// The Isle-Tree leaf: sorted cache lines in an unsorted node.
pub struct Isle;

mod recover;
use recover::{copy_rank, losers};

/// Recoveries (process-wide) that found pairs a split in place had moved
/// on still named by the old leaf's codes, and that found a key live twice
/// after a move between code words: the crash states recovery repairs.
pub static STALE_DROPPED: AtomicU64 = AtomicU64::new(0);
pub static DUPLICATES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Meta word of a compact pair seen as an nv element.
const COMPACT_META: u64 = (8 << 56) | (8 << 52);

/// Where a key lives in a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    line: u64,
    slot: u8,
    kind: Kind,
}

impl Loc {
    fn index(self) -> u64 {
        self.line * il::C_SLOTS as u64 + self.slot as u64
    }
    fn from_index(s: &impl Space, leaf: u64, i: u64) -> Loc {
        let line = i / il::C_SLOTS as u64;
        let code = il::decode((s.load(il::code_word(leaf, line)) >> il::code_shift(leaf, line)) as u8);
        Loc {
            line,
            slot: (i % il::C_SLOTS as u64) as u8,
            kind: code.kind,
        }
    }
}

/// Reads the code bytes of a leaf's data lines into `out` (at least
/// `data_lines(size)` long); returns how many.
fn read_codes<S: Space>(s: &S, leaf: u64, size: u64, out: &mut [u8]) -> usize {
    let d = il::data_lines(size);
    let mut line = 0;
    while line < d {
        let w = s.load(il::code_word(leaf, line));
        let shift = il::code_shift(leaf, line);
        let take = ((64 - shift) / 8).min((d - line) as u32);
        for b in 0..take {
            out[(line + b as u64) as usize] = (w >> (shift + 8 * b)) as u8;
        }
        line += take as u64;
    }
    d as usize
}

/// Runs `f` on the code bytes of a leaf's data lines (on the stack for
/// leaves up to 16 KiB).
#[inline]
fn with_codes<S: Space, R>(s: &S, leaf: u64, size: u64, f: impl FnOnce(&[u8]) -> R) -> R {
    let d = il::data_lines(size) as usize;
    if d <= 256 {
        let mut buf = [0u8; 256];
        let n = read_codes(s, leaf, size, &mut buf);
        f(&buf[..n])
    } else {
        let mut buf = vec![0u8; d];
        let n = read_codes(s, leaf, size, &mut buf);
        f(&buf[..n])
    }
}

/// The code bytes of a leaf's data lines.
fn codes<S: Space>(s: &S, leaf: u64, size: u64) -> Vec<u8> {
    with_codes(s, leaf, size, |c| c.to_vec())
}

/// Key words at or above this are dead in the leaf (its next word is
/// STALE: they moved to the successor, whose `low` it is); `u64::MAX` when
/// none are, or when the link does not name a line of the pool (damage
/// the leaf's validation reports).
fn dead_bound<S: Space>(s: &S, leaf: u64) -> u64 {
    let next = s.load(IsleLeaf::at(leaf).next_word());
    let succ = next & !il::STALE;
    if next & il::STALE != 0 && succ != 0 && succ.is_multiple_of(LINE) && succ < s.size() {
        s.load(IsleLeaf::at(succ).low_word())
    } else {
        u64::MAX
    }
}

/// Key word of a live slot.
fn slot_word<S: Space>(s: &S, lo: u64, kind: Kind, slot: u8) -> u64 {
    match kind {
        Kind::Compact => s.load(il::c_key(lo, slot)),
        _ => s.load(il::g_elem(lo, slot)),
    }
}

/// `code` without the slots `gone` names.
fn without(code: u8, gone: impl Fn(u8) -> bool) -> u8 {
    let c = il::decode(code);
    let keep: Vec<u8> = c.live().iter().copied().filter(|&x| !gone(x)).collect();
    il::Code::encode(c.kind, &keep).expect("a subset of a code has a code")
}

/// The blob a general pair refers to, if any (freed when the pair goes).
fn blob_of<S: Space>(s: &S, leaf: u64, size: u64, loc: Loc) -> Option<u64> {
    (loc.kind == Kind::General)
        .then(|| words_at(s, leaf, size, loc)[1])
        .filter(|&b| b != 0)
}

/// `code` without its slots whose key word is at least `bound`.
fn live_code<S: Space>(s: &S, lo: u64, code: u8, bound: u64) -> u8 {
    let kind = il::decode(code).kind;
    if bound == u64::MAX || kind == Kind::Empty {
        return code;
    }
    without(code, |x| slot_word(s, lo, kind, x) >= bound)
}

/// The slot's words as an nv element.
fn words_at<S: Space>(s: &S, leaf: u64, size: u64, loc: Loc) -> [u64; 4] {
    let lo = il::line(leaf, size, loc.line);
    match loc.kind {
        Kind::Compact => [
            s.load(il::c_key(lo, loc.slot)),
            0,
            s.load(il::c_value(lo, loc.slot)),
            COMPACT_META,
        ],
        _ => {
            let e = il::g_elem(lo, loc.slot);
            [s.load(e), s.load(e + 8), s.load(e + 16), s.load(e + 24)]
        }
    }
}

/// Order of the general element `words` against `key` (`kw` its word).
fn cmp_general<S: Space>(s: &S, words: &[u64; 4], key: &[u8], kw: u64) -> Cmp {
    match words[0].cmp(&kw) {
        Cmp::Equal => {}
        o => return o,
    }
    match Meta::decode(words[3]).and_then(|m| m.key_inline) {
        Some(l) => (l as usize).cmp(&key.len().min(8)).then((l as usize).cmp(&key.len())),
        None if key.len() <= 8 => Cmp::Greater,
        None => blob::cmp_key_at(s, blob::key_at(words[1]), blob::lens(s.read_u64(words[1])).0, key),
    }
}

/// Finds `key` among the live slots, leaving each line at its first larger
/// key (the paper's hops).
///
/// On a read-only space the leaf may still hold both copies a crash inside
/// a move between code words left (a writable open drops the loser from
/// the codes, see [`losers`]): there the search goes on past a match and
/// returns the copy recovery keeps.
fn find<S: Space>(s: &S, leaf: u64, size: u64, codes: &[u8], key: &[u8]) -> Option<Loc> {
    let mut best = find_from(s, leaf, size, codes, key, 0)?;
    if !s.writable() {
        let mut from = best.line + 1;
        while let Some(other) = find_from(s, leaf, size, codes, key, from) {
            if copy_rank(other.kind, &words_at(s, leaf, size, other))
                > copy_rank(best.kind, &words_at(s, leaf, size, best))
            {
                best = other;
            }
            from = other.line + 1;
        }
    }
    Some(best)
}

/// [`find`] from data line `start` on, returning the first copy found.
fn find_from<S: Space>(s: &S, leaf: u64, size: u64, codes: &[u8], key: &[u8], start: u64) -> Option<Loc> {
    let kw = nv::key_word(key);
    let compact_key = key.len() == 8;
    let h = il::header_lines(size);
    for (line, &c) in codes.iter().enumerate().skip(start as usize) {
        let code = il::decode(c);
        let lo = leaf + (h + line as u64) * LINE;
        match code.kind {
            Kind::Empty => {}
            Kind::Compact => {
                if !compact_key {
                    continue;
                }
                for &slot in code.live() {
                    let k = s.load(il::c_key(lo, slot));
                    if k == kw {
                        return Some(Loc {
                            line: line as u64,
                            slot,
                            kind: Kind::Compact,
                        });
                    }
                    if k > kw {
                        break;
                    }
                }
            }
            Kind::General => {
                for &slot in code.live() {
                    let e = il::g_elem(lo, slot);
                    let k = s.load(e);
                    if k > kw {
                        break;
                    }
                    if k < kw {
                        continue;
                    }
                    let words = [k, s.load(e + 8), s.load(e + 16), s.load(e + 24)];
                    match cmp_general(s, &words, key, kw) {
                        Cmp::Equal => {
                            return Some(Loc {
                                line: line as u64,
                                slot,
                                kind: Kind::General,
                            })
                        }
                        Cmp::Greater => break,
                        Cmp::Less => {}
                    }
                }
            }
        }
    }
    None
}

/// Whether a key with word `kw` has moved on from the leaf (a split in
/// place since the caller routed).
#[inline]
fn moved(leaf: &Leaf<Isle>, kw: u64) -> bool {
    let high = leaf.high.load(Ordering::Acquire);
    high != u64::MAX && kw >= high
}

/// The code word of `line` with that line's byte set to `code`.
fn with_code(word: u64, leaf: u64, line: u64, code: u8) -> u64 {
    let shift = il::code_shift(leaf, line);
    (word & !(0xff << shift)) | ((code as u64) << shift)
}

/// Stores a code word, flushes and fences it.
fn publish_codes<S: Space>(s: &S, word_off: u64, word: u64) {
    s.store(word_off, word);
    s.flush(word_off, 8, points::ISLE_CODE_FLUSH);
    s.fence(points::ISLE_CODE_FENCE);
}

/// Rank of `key` among a line's live slots `live` (in key order) of `kind`:
/// their count if it is largest.
fn rank<S: Space>(s: &S, lo: u64, kind: Kind, live: &[u8], key: &[u8]) -> usize {
    let kw = nv::key_word(key);
    live.iter()
        .position(|&slot| match kind {
            Kind::Compact => s.load(il::c_key(lo, slot)) > kw,
            _ => {
                let e = il::g_elem(lo, slot);
                let words = [s.load(e), s.load(e + 8), s.load(e + 16), s.load(e + 24)];
                cmp_general(s, &words, key, kw) == Cmp::Greater
            }
        })
        .unwrap_or(live.len())
}

/// A line of `kind` with a free slot, else an empty line, preferring `near`.
fn vacancy(codes: &[u8], kind: Kind, near: Option<u64>) -> Option<(u64, u8)> {
    let free = |line: usize| {
        let c = il::decode(codes[line]);
        match c.kind {
            Kind::Empty => Some(0),
            k if k == kind => c.free_slot(),
            _ => None,
        }
    };
    if let Some(n) = near {
        if let Some(slot) = free(n as usize).filter(|_| il::decode(codes[n as usize]).kind == kind) {
            return Some((n, slot));
        }
    }
    let same = (0..codes.len()).find_map(|l| {
        let c = il::decode(codes[l]);
        (c.kind == kind).then(|| c.free_slot().map(|s| (l as u64, s))).flatten()
    });
    same.or_else(|| (0..codes.len()).find_map(|l| (codes[l] == 0).then(|| free(l).map(|s| (l as u64, s))).flatten()))
}

fn is_compact(key: &[u8], value: &[u8]) -> bool {
    key.len() == 8 && value.len() == 8
}

/// Every live slot of a leaf as a [`Slot`] (long keys loaded), without
/// the dead ones a STALE link names and, on a read-only space, without the
/// losing copies a crash inside a move between code words left (a writable
/// open has dropped those from the codes).
fn slots<S: Space>(s: &S, leaf: u64, size: u64) -> Vec<(Loc, Slot)> {
    let all = all_slots(s, leaf, size);
    if s.writable() {
        return all;
    }
    let losers = losers(&all);
    if losers.is_empty() {
        return all;
    }
    all.into_iter().filter(|(l, _)| !losers.contains(l)).collect()
}

/// [`slots`] with every copy of a key the codes name.
fn all_slots<S: Space>(s: &S, leaf: u64, size: u64) -> Vec<(Loc, Slot)> {
    let cs = codes(s, leaf, size);
    let bound = dead_bound(s, leaf);
    let mut out = Vec::new();
    for (line, &c) in cs.iter().enumerate() {
        let code = il::decode(live_code(s, il::line(leaf, size, line as u64), c, bound));
        for &slot in code.live() {
            let loc = Loc {
                line: line as u64,
                slot,
                kind: code.kind,
            };
            let words = words_at(s, leaf, size, loc);
            let long_key = match Meta::decode(words[3]).and_then(|m| m.key_inline) {
                Some(_) => None,
                None => Some(element::element_key(s, &words).into_boxed_slice()),
            };
            out.push((
                loc,
                Slot {
                    words,
                    long_key,
                    settled: false,
                },
            ));
        }
    }
    out
}

impl LeafFormat for Isle {
    /// The leaf's sequence word: odd while a writer changes a published
    /// word in place and until the change is durable (see the module docs).
    type State = AtomicU64;

    #[inline]
    fn read_settled<T>(leaf: &Leaf<Self>, f: impl FnMut() -> T) -> T {
        read_stable(&leaf.state, f)
    }

    /// A write takes one slot (an update of a compact value none, but
    /// it still counts as a write).
    fn appended(_inserted: bool) -> u64 {
        1
    }

    const NAME: &'static str = "isle";
    const VERSIONED: bool = false;

    fn capacity(size: u64) -> u64 {
        il::capacity(size)
    }
    fn count<S: Space>(s: &S, leaf: u64) -> u64 {
        let size = Self::size(s, leaf);
        let pool = crate::format::header::pool_size(s).min(s.size());
        if size < il::MIN_SIZE || size % LINE != 0 || size > pool.saturating_sub(leaf) {
            return u64::MAX; // not a leaf: callers reject it
        }
        let bound = dead_bound(s, leaf);
        codes(s, leaf, size)
            .iter()
            .enumerate()
            .map(|(line, &c)| {
                let c = live_code(s, il::line(leaf, size, line as u64), c, bound);
                il::decode(c).len.min(4) as u64
            })
            .sum()
    }
    fn next<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(IsleLeaf::at(leaf).next_word()) & !il::STALE
    }
    fn size<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(IsleLeaf::at(leaf).size_word())
    }
    fn next_word(leaf: u64) -> u64 {
        IsleLeaf::at(leaf).next_word()
    }

    fn newest<S: Space>(s: &S, leaf: &Leaf<Isle>, _n: u64, key: &[u8], _at: u64) -> Option<Newest> {
        let leaf = leaf.off;
        let size = Self::size(s, leaf);
        let cs = codes(s, leaf, size);
        find(s, leaf, size, &cs, key).map(|loc| Newest {
            index: loc.index(),
            negative: false,
            version: 0,
        })
    }

    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem {
        let size = Self::size(s, leaf);
        let words = words_at(s, leaf, size, Loc::from_index(s, leaf, i));
        Elem {
            key: element::element_key(s, &words),
            words,
        }
    }

    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8> {
        let size = Self::size(s, leaf);
        element::element_value(s, &words_at(s, leaf, size, Loc::from_index(s, leaf, i)))
    }

    fn append<S: Space>(_s: &S, _leaf: &Leaf<Isle>, _n: u64, _elems: &[[u64; 4]]) {
        unreachable!("isle leaves take no appends (transactions need an nv pool)")
    }

    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]) {
        Self::build_with_low(s, leaf, size, next, elems, 0)
    }

    const SPLITS_IN_PLACE: bool = true;

    fn build_with_low<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot], low: u64) {
        let (lines, _) = pack(elems);
        let h = il::header_lines(size);
        assert!(
            lines.len() as u64 <= il::data_lines(size),
            "isle build overflows its leaf"
        );
        let used = ((h + lines.len() as u64) * LINE) as usize;
        let mut buf = vec![0u8; used];
        let put = |buf: &mut [u8], at: u64, w: u64| buf[at as usize..at as usize + 8].copy_from_slice(&w.to_le_bytes());
        il::write_meta(&mut buf, next, size, low);
        for (line, (kind, members)) in lines.iter().enumerate() {
            let order: Vec<u8> = (0..members.len() as u8).collect();
            let code = il::Code::encode(*kind, &order).expect("a packed line has a code");
            il::write_code(&mut buf, line as u64, code);
            let lo = (h + line as u64) * LINE;
            for (slot, e) in members.iter().enumerate() {
                let slot = slot as u8;
                match kind {
                    Kind::Compact => {
                        put(&mut buf, il::c_key(lo, slot), e.words[0]);
                        put(&mut buf, il::c_value(lo, slot), e.words[2]);
                    }
                    _ => {
                        for (k, w) in e.words.iter().enumerate() {
                            put(&mut buf, il::g_elem(lo, slot) + 8 * k as u64, *w);
                        }
                    }
                }
            }
        }
        s.write(leaf, &buf);
        s.flush(leaf, used as u64, points::NV_NEWLEAF_FLUSH);
    }

    fn read_ref<S: Space>(s: &S, leaf: &Leaf<Isle>, key: &[u8], _at: u64) -> Option<Option<ValueRef>> {
        let kw = nv::key_word(key);
        // The element's words are taken only once no writer moved them
        // meanwhile; a blob they name is immutable and stays allocated
        // while the caller's epoch is pinned, so it is read afterwards.
        read_stable(&leaf.state, || {
            if moved(leaf, kw) {
                return None;
            }
            Some(with_codes(s, leaf.off, leaf.size, |cs| {
                find(s, leaf.off, leaf.size, cs, key).map(|loc| match loc.kind {
                    Kind::Compact => {
                        let lo = il::line(leaf.off, leaf.size, loc.line);
                        ValueRef::Inline {
                            word: s.load(il::c_value(lo, loc.slot)),
                            len: 8,
                        }
                    }
                    _ => ValueRef::of(s, &words_at(s, leaf.off, leaf.size, loc)),
                })
            }))
        })
    }

    fn upsert<S: Space>(
        s: &S,
        leaf: &Leaf<Isle>,
        key: &[u8],
        value: &[u8],
        blob: u64,
        existing: bool,
        clock: &Clock,
    ) -> Written {
        if moved(leaf, nv::key_word(key)) {
            return Written::Moved;
        }
        let (off, size) = (leaf.off, leaf.size);
        let cs = codes(s, off, size);
        let old = find(s, off, size, &cs, key);
        if existing && old.is_none() {
            return Written::Absent;
        }
        let compact = is_compact(key, value);
        if let Some(o) = old.filter(|o| o.kind == Kind::Compact && compact) {
            // The paper's update: one atomic store of the value word.
            let w = clock.begin_write();
            let at = il::c_value(il::line(off, size, o.line), o.slot);
            leaf::store_in_place(
                s,
                &leaf.state,
                at,
                inline_value_word(value),
                points::ISLE_VALUE_FLUSH,
                points::ISLE_VALUE_FENCE,
            );
            drop(w);
            return Written::Done {
                inserted: false,
                freed: None,
            };
        }
        // A pair that replaces one in another code word is written general:
        // if a crash leaves both, the general one with the newer version wins.
        let kind = if compact && old.is_none() {
            Kind::Compact
        } else {
            Kind::General
        };
        let Some((line, slot)) = vacancy(&cs, kind, old.map(|o| o.line)) else {
            return Written::Full;
        };
        let w = clock.begin_write();
        let lo = il::line(off, size, line);
        match kind {
            Kind::Compact => {
                s.store(il::c_key(lo, slot), nv::key_word(key));
                s.store(il::c_value(lo, slot), inline_value_word(value));
            }
            _ => {
                let words = encode(key, value, blob, w.ts, false);
                for (k, word) in words.iter().enumerate() {
                    s.store(il::g_elem(lo, slot) + 8 * k as u64, *word);
                }
            }
        }
        s.flush(lo, LINE, points::ISLE_SLOT_FLUSH);
        s.fence(points::ISLE_SLOT_FENCE);

        // The new code of the target line: the slot ranked in (the old
        // slot ranked out when it is in the same line).
        let mut order: Vec<u8> = il::decode(cs[line as usize]).live().to_vec();
        if let Some(o) = old.filter(|o| o.line == line) {
            order.retain(|&x| x != o.slot);
        }
        order.insert(rank(s, lo, kind, &order, key), slot);
        let new_code = il::Code::encode(kind, &order).expect("ordered slots have a code");
        let word_off = il::code_word(off, line);
        let mut word = with_code(s.load(word_off), off, line, new_code);
        let freed = old.and_then(|o| blob_of(s, off, size, o));
        // The old pair's line, when it is another one: its code without the pair.
        let moved_from = old
            .filter(|o| o.line != line)
            .map(|o| (o.line, without(cs[o.line as usize], |x| x == o.slot)));
        let elsewhere = match moved_from {
            Some((ol, oc)) if il::code_word(off, ol) == word_off => {
                word = with_code(word, off, ol, oc);
                None
            }
            m => m,
        };
        write_visible(&leaf.state, || {
            publish_codes(s, word_off, word);
            if let Some((ol, oc)) = elsewhere {
                // The old pair's code lives in another word: drop it there too.
                let o_off = il::code_word(off, ol);
                s.store(o_off, with_code(s.load(o_off), off, ol, oc));
                s.flush(o_off, 8, points::ISLE_CODE_FLUSH);
                s.fence(points::ISLE_CODE_FENCE);
            }
        });
        drop(w);
        if old.is_none() {
            leaf.durable.fetch_add(1, Ordering::Relaxed);
        }
        Written::Done {
            inserted: old.is_none(),
            freed,
        }
    }

    fn remove<S: Space>(s: &S, leaf: &Leaf<Isle>, key: &[u8], clock: &Clock) -> Removed {
        if moved(leaf, nv::key_word(key)) {
            return Removed::Moved;
        }
        let (off, size) = (leaf.off, leaf.size);
        let cs = codes(s, off, size);
        let Some(o) = find(s, off, size, &cs, key) else {
            return Removed::Done {
                existed: false,
                freed: None,
            };
        };
        let freed = blob_of(s, off, size, o);
        let oc = without(cs[o.line as usize], |x| x == o.slot);
        let word_off = il::code_word(off, o.line);
        let w = clock.begin_write();
        write_visible(&leaf.state, || {
            publish_codes(s, word_off, with_code(s.load(word_off), off, o.line, oc))
        });
        drop(w);
        leaf.durable.fetch_sub(1, Ordering::Relaxed);
        Removed::Done { existed: true, freed }
    }

    fn collate_leaf<S: Space>(s: &S, leaf: &Leaf<Isle>, _keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated {
        let bounded = !matches!((lo, hi), (RB::Unbounded, RB::Unbounded));
        let mut valid: Vec<Slot> = read_stable(&leaf.state, || {
            slots(s, leaf.off, leaf.size)
                .into_iter()
                .map(|(_, x)| x)
                .filter(|x| !bounded || x.in_range(lo, hi))
                .collect()
        });
        valid.sort_by(|a, b| a.key_cmp(b));
        let max_version = valid.iter().map(|x| x.version()).max().unwrap_or(0);
        Collated {
            live: valid.len() as u64,
            max_key: valid.last().map(|x| x.key()),
            max_version,
            dropped_blobs: Vec::new(),
            valid,
        }
    }

    fn relink(old: u64, new_off: u64) -> u64 {
        new_off | (old & il::STALE)
    }

    fn low<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(IsleLeaf::at(leaf).low_word())
    }

    fn split_in_place<S: Space>(s: &S, leaf: &Leaf<Isle>, new_off: u64, right: &[Slot]) {
        let (off, size) = (leaf.off, leaf.size);
        // The link publishes the new leaf and, by STALE, kills the moved pairs here.
        let nw = IsleLeaf::at(off).next_word();
        s.store(nw, new_off | il::STALE);
        s.flush(nw, 8, points::NV_LINK_FLUSH);
        s.fence(points::NV_LINK_FENCE);
        // Then the codes forget them, so their slots are free again.
        let bound = right[0].words[0];
        let cs = codes(s, off, size);
        write_visible(&leaf.state, || {
            let (mut first, mut last) = (u64::MAX, 0);
            for (line, &c) in cs.iter().enumerate() {
                let line = line as u64;
                let lc = live_code(s, il::line(off, size, line), c, bound);
                if lc != c {
                    let w = il::code_word(off, line);
                    s.store(w, with_code(s.load(w), off, line, lc));
                    first = first.min(w);
                    last = last.max(w);
                }
            }
            if first <= last {
                s.flush(first, last + 8 - first, points::ISLE_CODE_FLUSH);
                s.fence(points::ISLE_CODE_FENCE);
            }
        });
        leaf.durable.fetch_sub(right.len() as u64, Ordering::Relaxed);
    }

    fn fits(size: u64, elems: &[Slot], extra: u64) -> bool {
        // Room for the elements and for `extra` more in lines of their own.
        lines_for(elems) + extra.div_ceil(il::G_SLOTS as u64) <= il::data_lines(size)
    }

    fn has_room<S: Space>(_s: &S, _leaf: &Leaf<Isle>, _need: u64) -> bool {
        // Room depends on the kind of pair; a writer that found none asked
        // for the rewrite, and a leaf another writer replaced is dead.
        false
    }

    fn lower_count<S: Space>(_s: &S, leaf: u64, _count: u64) {
        // Isle writes publish pair by pair through code words, never as a
        // multi-leaf transaction: its scan never asks for an undo.
        unreachable!("isle leaf {leaf} has no count to lower");
    }

    fn scan<S: Space>(s: &S, off: u64, committed: u64) -> std::result::Result<Scan, String> {
        recover::scan(s, off, committed)
    }

    fn validate<S: Space>(
        s: &S,
        off: u64,
        data_start: u64,
    ) -> std::result::Result<(u64, Option<u64>), crate::format::validate::Damage> {
        crate::format::validate::isle_leaf(s, off, data_start).map(|size| (size, None))
    }

    fn audit<S: Space>(s: &S, leaf: &Leaf<Isle>, ctx: &AuditCtx<'_>) -> Audit {
        recover::audit(s, leaf, ctx)
    }
}

/// Packs key-ordered elements into lines: compact pairs four to a line,
/// the rest two to a line, each line in key order. Returns the lines and
/// how many data lines they take.
fn pack(elems: &[Slot]) -> (Vec<(Kind, Vec<&Slot>)>, u64) {
    let compact = |e: &Slot| e.blob() == 0 && e.words[3] & !nv::VERSION_MASK == COMPACT_META;
    let mut lines: Vec<(Kind, Vec<&Slot>)> = Vec::new();
    let (c, g): (Vec<&Slot>, Vec<&Slot>) = elems.iter().partition(|e| compact(e));
    for chunk in c.chunks(il::C_SLOTS) {
        lines.push((Kind::Compact, chunk.to_vec()));
    }
    for chunk in g.chunks(il::G_SLOTS) {
        lines.push((Kind::General, chunk.to_vec()));
    }
    let n = lines.len() as u64;
    (lines, n)
}

/// Data lines `elems` take in a new isle leaf.
pub fn lines_for(elems: &[Slot]) -> u64 {
    pack(elems).1
}
