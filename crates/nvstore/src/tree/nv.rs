//! The `nv` leaf format (NV-Tree §4.3–4.4): unsorted, append-only,
//! published by one atomic count. Its byte layout is `format/leaf_nv.rs`.

use std::collections::HashMap;
use std::ops::Bound as RB;
use std::sync::atomic::Ordering;

use super::collate::{collate, collate_in, Collated, Keep, Slot};
use super::hints::{cached_layout, element_lookup_word, fingerprint, hints, lookup_word, Hints, KeyTable, NvState};
use super::leaf::{
    read_stable, show, store_in_place, write_visible, Audit, AuditCtx, Elem, LeafFormat, Lookup, Newest, Removed, Scan,
    ValueRef, Written,
};
use super::mvcc::Clock;
use super::Leaf;
use crate::format::blob;
use crate::format::element::{
    element_key, element_value, encode, inline_value_word, leaf_blob_ok, negate, validate_blob,
};
use crate::format::leaf_nv::{self as nv, Layout, Meta, NvLeaf, SealAt};
use crate::pmem::{points, Space, LINE};

/// The NV-Tree leaf: unsorted, append-only, published by its count.
pub struct Nv;

/// [`LeafFormat::guide`] of an nv leaf: its offset in the low bits, its
/// compact entry count from bit 48.
const GUIDE_COUNT_SHIFT: u32 = 48;
const GUIDE_OFF_MASK: u64 = (1 << GUIDE_COUNT_SHIFT) - 1;
const GUIDE_COUNT_MAX: u64 = (1 << (64 - GUIDE_COUNT_SHIFT)) - 1;

/// Full element `i` as the newest for `key` (key word `kw`) at `at`, if it
/// holds that key and is visible at `at`.
#[inline]
fn full_match<S: Space>(s: &S, layout: &Layout, i: u64, key: &[u8], kw: u64, at: u64) -> Option<Newest> {
    let e = layout.elem(i);
    if s.read_u64(e + nv::E_KEY_WORD) != kw {
        return None;
    }
    let meta_w = s.read_u64(e + nv::E_META) & nv::META_MASK;
    if meta_w & nv::VERSION_MASK > at {
        return None;
    }
    let meta = Meta::decode(meta_w).expect("published element has valid meta");
    let same = match meta.key_inline {
        Some(l) => l as usize == key.len(),
        None => {
            key.len() > 8 && {
                let b = s.read_u64(e + nv::E_BLOB) & nv::BLOB_MASK;
                let (kl, _) = blob::lens(s.read_u64(b));
                kl as usize == key.len() && blob::cmp_key_at(s, blob::key_at(b), kl, key).is_eq()
            }
        }
    };
    same.then(|| Newest {
        index: i,
        negative: meta.negative || layout.is_gone(i),
        version: meta.version,
    })
}

/// [`Nv::prefetch_guess`]'s span: the pool offsets of the first and the
/// last compact entry it loads, two entries either side of where `kw`
/// falls between the bound words `lo` (exclusive) and `hi`.
#[inline]
fn guessed_entries(guide: u64, lo: u64, hi: u64, kw: u64) -> Option<(u64, u64)> {
    let compact = guide >> GUIDE_COUNT_SHIFT;
    if compact == 0 || kw <= lo || kw > hi {
        return None;
    }
    // In floating point: a hint needs no exact quotient, and a 128-bit
    // integer division is a library call of tens of cycles.
    let at = (((kw - lo) as f64 / (hi - lo) as f64) * compact as f64) as u64;
    let entry = |j: u64| (guide & GUIDE_OFF_MASK) + nv::ELEMS_OFF + j * nv::COMPACT_SIZE;
    Some((entry(at.saturating_sub(2)), entry((at + 2).min(compact - 1))))
}

/// The newest element for `key` among the first `n` at `at`, from the key
/// table: `Some(answer)` when the table decides, `None` when the
/// fingerprint scan must.
#[inline]
#[allow(clippy::too_many_arguments)]
fn newest_by_table<S: Space>(
    s: &S,
    t: &KeyTable,
    layout: &Layout,
    n: u64,
    key: &[u8],
    kw: u64,
    lw: u64,
    at: u64,
) -> Option<Option<Newest>> {
    if !t.covers(n) {
        return None;
    }
    // No element below `n` has this lookup word.
    let Some(i) = t.find(lw) else {
        return Some(None);
    };
    // The newest element with this key word (or with a word whose tag
    // collides): if it holds `key` and is visible at `at`, it is `key`'s
    // newest; otherwise an older element may be, and the scan looks.
    if i >= n {
        return None;
    }
    if i < layout.compact {
        return compact_match(s, layout, i, key, kw, at).map(Some);
    }
    full_match(s, layout, i, key, kw, at).map(Some)
}

/// Compact entry `i` as the newest for `key` (key word `kw`) at `at`: the
/// prefix holds only 8-byte keys, one entry per key, all at one version.
/// An entry deleted in place reads as a NEGATIVE element at that version.
#[inline]
fn compact_match<S: Space>(s: &S, layout: &Layout, i: u64, key: &[u8], kw: u64, at: u64) -> Option<Newest> {
    let hit = key.len() == 8 && layout.compact_version <= at && layout.key_word(s, i) == kw;
    hit.then(|| Newest {
        index: i,
        negative: layout.is_gone(i),
        version: layout.compact_version,
    })
}

/// [`LeafFormat::newest`] as the leaf's words say.
#[inline]
fn newest_in<S: Space>(s: &S, leaf: &Leaf<Nv>, h: &Hints, n: u64, key: &[u8], at: u64) -> Option<Newest> {
    let kw = nv::key_word(key);
    let lw = lookup_word(key);
    let fk = fingerprint(lw);
    let layout = h.layout(leaf.off);
    // Newest first: the newest element for a key decides (a NEGATIVE one
    // cancels the positive it follows, NV-Tree §4.3). Full elements
    // are newer than the compact prefix. Only elements whose
    // fingerprint matches (or is unknown) are read from the leaf.
    if let Some(t) = &h.table {
        if let Some(found) = newest_by_table(s, t, &layout, n, key, kw, lw, at) {
            return found;
        }
    }
    let mut found = None;
    h.candidates(layout.compact, n, fk, |i| {
        found = full_match(s, &layout, i, key, kw, at);
        found.is_some()
    });
    // The prefix holds only 8-byte keys, one entry per key.
    if found.is_some() || key.len() != 8 || layout.compact_version > at {
        return found;
    }
    h.candidates(0, layout.compact.min(n), fk, |i| {
        found = compact_match(s, &layout, i, key, kw, at);
        found.is_some()
    });
    found
}

/// The deletion bits, within word `i / 64` of the leaf's two, of every
/// element that holds `key`, whose newest element is `i`: `i` itself and
/// its older versions (gone or not); `None` when one lies outside that
/// word (a delete in place must hide them all with one store, or an older
/// version would show again). A compact entry is its key's only element.
fn key_bits<S: Space>(s: &S, leaf: &Leaf<Nv>, layout: &Layout, key: &[u8], i: u64) -> Option<u64> {
    let word = i / 64;
    if i >= nv::GONE_SLOTS {
        return None;
    }
    let mut bits = 1u64 << (i % 64);
    if i < layout.compact {
        return Some(bits);
    }
    let kw = nv::key_word(key);
    let mut outside = false;
    hints(s, leaf).candidates(0, i, fingerprint(lookup_word(key)), |j| {
        let holds = if j < layout.compact {
            compact_match(s, layout, j, key, kw, u64::MAX).is_some()
        } else {
            full_match(s, layout, j, key, kw, u64::MAX).is_some()
        };
        if holds {
            if j / 64 == word {
                bits |= 1 << (j % 64);
            } else {
                outside = true;
            }
        }
        outside
    });
    (!outside).then_some(bits)
}

/// Which of `elems` (key order, a key's versions adjacent, a settled
/// element first among them) a new leaf stores in its compact prefix, and
/// how many: settled elements with 8-byte keys and values, one per key, so
/// the prefix comes out in strictly increasing key order, each before the
/// key's full elements (version order kept).
/// Which of `elems` [`Nv::build`] stores in the compact prefix (the first
/// `keep` that [`prefix_plan`] says fit), and `keep`.
fn prefix_members(elems: &[Slot]) -> (Vec<bool>, u64) {
    let (mut members, keep) = prefix_plan(elems);
    let mut taken = 0;
    for m in members.iter_mut() {
        *m = *m && taken < keep;
        taken += *m as u64;
    }
    (members, keep)
}

fn prefix_plan(elems: &[Slot]) -> (Vec<bool>, u64) {
    let fits: Vec<bool> = {
        let mut last = None;
        elems
            .iter()
            .map(|e| {
                let fits = e.settled
                    && e.long_key.is_none()
                    && nv::compactable(&e.words)
                    && last.is_none_or(|w| w < e.words[0]);
                if fits {
                    last = Some(e.words[0]);
                }
                fits
            })
            .collect()
    };
    // An update appends two elements: when they start on a line, they
    // flush one line instead of two. The first append goes where the
    // built elements end, so if that is mid-line, the last one or two
    // compact candidates are stored full instead (moving one shifts
    // the end by half a line when the prefix has an even number of
    // entries; two otherwise). Every later update keeps the alignment.
    let candidates = fits.iter().filter(|&&f| f).count() as u64;
    let full_count = elems.len() as u64 - candidates;
    let end = |c: u64| nv::full_start(c) + (full_count + candidates - c) * nv::ELEM_SIZE;
    let keep = [candidates, candidates.saturating_sub(1), candidates.saturating_sub(2)]
        .into_iter()
        .find(|&c| end(c) % LINE == 0)
        .unwrap_or(candidates);
    (fits, keep)
}

impl LeafFormat for Nv {
    type State = NvState;

    const NAME: &'static str = "nv";

    #[inline]
    fn capacity(size: u64) -> u64 {
        nv::capacity(size)
    }
    #[inline]
    fn max_count(size: u64) -> u64 {
        nv::max_count(size)
    }
    #[inline]
    fn room<S: Space>(s: &S, leaf: &Leaf<Nv>) -> u64 {
        nv::capacity_at(leaf.size, hints(s, leaf).compact)
    }
    #[inline]
    fn count<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(NvLeaf::at(leaf).count_word())
    }
    #[inline]
    fn next<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(NvLeaf::at(leaf).next_word())
    }
    #[inline]
    fn size<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(NvLeaf::at(leaf).size_word())
    }
    #[inline]
    fn next_word(leaf: u64) -> u64 {
        NvLeaf::at(leaf).next_word()
    }

    fn layout_ok<S: Space>(s: &S, leaf: u64, size: u64, count: u64) -> bool {
        Layout::read(s, leaf).valid(size, count)
    }

    fn newest<S: Space>(s: &S, leaf: &Leaf<Nv>, n: u64, key: &[u8], at: u64) -> Option<Newest> {
        let h = hints(s, leaf);
        let mut found = newest_in(s, leaf, h, n, key, at)?;
        if found.index < h.compact {
            // A compact entry keeps the prefix's version when its value is
            // replaced in place; the write's timestamp is remembered for the
            // leaf in DRAM, so a watch or a conflict check still sees a
            // write made after it (spuriously, for another key of the leaf).
            found.version = found.version.max(leaf.state.in_place.load(Ordering::Acquire));
        }
        Some(found)
    }

    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem {
        let words = Layout::read(s, leaf).words(s, i);
        Elem {
            key: element_key(s, &words),
            words,
        }
    }

    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8> {
        element_value(s, &Layout::read(s, leaf).words(s, i))
    }

    fn append<S: Space>(s: &S, leaf: &Leaf<Nv>, n: u64, elems: &[[u64; 4]]) {
        let h = hints(s, leaf);
        for (j, e) in elems.iter().enumerate() {
            // A long key's blob was written just before: reading it back hits the cache.
            match element_lookup_word(s, e) {
                Some(lw) => h.note(n + j as u64, lw),
                None => h.note_unknown(n + j as u64),
            }
        }
        let layout = h.layout(leaf.off);
        let at = layout.elem(n);
        let leaf = leaf.off;
        let stamp = NvLeaf::at(leaf).stamp(s);
        let mut chain = layout.chain(s, n);
        let len = elems.len() * nv::ELEM_SIZE as usize;
        // Plain writes append one or two elements: no heap allocation.
        let mut small = [0u8; 2 * nv::ELEM_SIZE as usize];
        let mut large = Vec::new();
        let buf: &mut [u8] = if len <= small.len() {
            &mut small[..len]
        } else {
            large.resize(len, 0);
            &mut large
        };
        for (j, w) in elems.iter().enumerate() {
            let w = if stamp == 0 {
                *w
            } else {
                let at = SealAt {
                    leaf,
                    stamp,
                    slot: n + j as u64,
                    chain,
                };
                let sealed = nv::seal(*w, j + 1 < elems.len(), &at);
                chain = [sealed[1], sealed[3]];
                sealed
            };
            for (k, word) in w.iter().enumerate() {
                let o = j * 32 + k * 8;
                buf[o..o + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        if stamp != 0 {
            // A sealed element publishes itself after a crash, so the new
            // blob it names must be durable before it can reach the media
            // (only writes with a key or value over 8 bytes pay this).
            if elems.iter().any(|w| w[1] != 0 && w[3] & nv::NEGATIVE == 0) {
                s.fence(points::BLOB_FENCE);
            }
            s.write(at, buf);
            // Sealed leaf: one barrier, and no store to the count word. The
            // count lives in DRAM (the caller's `durable`) until a clean
            // shutdown persists it ([`LeafFormat::settle`]); after a crash
            // the elements' checks decide. (A count stored here but left
            // unflushed would keep one line per touched leaf dirty until
            // shutdown: cache traffic for nothing.)
            s.flush(at, len as u64, points::NV_ELEMENT_FLUSH);
            s.fence(points::NV_ELEMENT_FENCE);
            return;
        }
        // Unsealed leaf of a format-2 pool: the paper's two barriers.
        s.write(at, buf);
        s.flush(at, len as u64, points::NV_ELEMENT_FLUSH);
        s.fence(points::NV_ELEMENT_FENCE);
        s.publish(
            NvLeaf::at(leaf).count_word(),
            n + elems.len() as u64,
            points::NV_COUNT_FLUSH,
            points::NV_COUNT_FENCE,
        );
    }

    fn fits(size: u64, elems: &[Slot], extra: u64) -> bool {
        let (_, keep) = prefix_plan(elems);
        elems.len() as u64 + extra <= nv::capacity_at(size, keep)
    }

    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]) {
        let (in_prefix, keep) = prefix_members(elems);
        assert!(elems.len() as u64 <= nv::capacity_at(size, keep));
        let mut compact: Vec<&Slot> = Vec::with_capacity(keep as usize);
        let mut full: Vec<&Slot> = Vec::with_capacity(elems.len() - keep as usize);
        for (e, &c) in elems.iter().zip(&in_prefix) {
            if c {
                compact.push(e);
            } else {
                full.push(e);
            }
        }
        let version = compact.iter().map(|e| e.version()).max().unwrap_or(0);
        let start = nv::full_start(compact.len() as u64);
        let used = start + full.len() as u64 * nv::ELEM_SIZE;
        let mut img = nv::LeafImage::zeroed(used);
        let stamp = nv::fresh_stamp(leaf, NvLeaf::at(leaf).stamp(s));
        img.write_head(&nv::Head {
            count: elems.len() as u64,
            next,
            size,
            compact: compact.len() as u64,
            compact_version: version,
            stamp,
        });
        for (j, e) in compact.iter().enumerate() {
            img.write_compact(j as u64, e.words[0], e.words[2]);
        }
        let mut chain = [0, 0];
        for (j, e) in full.iter().enumerate() {
            let at = SealAt {
                leaf,
                stamp,
                slot: compact.len() as u64 + j as u64,
                chain,
            };
            let sealed = nv::seal(e.words, false, &at);
            chain = [sealed[1], sealed[3]];
            img.write_full(start + j as u64 * nv::ELEM_SIZE, &sealed);
        }
        s.write(leaf, img.bytes());
        s.flush(leaf, used.max(LINE), points::NV_NEWLEAF_FLUSH);
    }

    /// The new leaf's hints come from the elements in hand, as `build`
    /// placed them, instead of from the leaf's lines on first use (which
    /// the build's flush may have evicted): the write that follows a
    /// split, and every lookup of the new leaf, find them ready.
    fn handle<S: Space>(s: &S, off: u64, size: u64, elems: &[Slot]) -> Leaf<Self> {
        let leaf = Leaf::<Nv>::built(off, size, elems.len() as u64);
        // `build`'s placement: the prefix's members in order, the rest after.
        let (compact, keep) = prefix_members(elems);
        let in_prefix = || elems.iter().zip(&compact).filter(|(_, &c)| c).map(|(e, _)| e);
        let layout = Layout {
            leaf: off,
            compact: keep,
            compact_version: in_prefix().map(|e| e.version()).max().unwrap_or(0),
            gone: [0; 2],
        };
        let h = Hints::empty(&layout, [0; 2], nv::capacity_at(size, keep).max(elems.len() as u64));
        for (i, e) in in_prefix().enumerate() {
            h.note(i as u64, e.words[0]);
        }
        let rest = elems.iter().zip(&compact).filter(|(_, &c)| !c);
        for (i, (e, _)) in (keep..).zip(rest) {
            let lw = match &e.long_key {
                Some(k) => Some(lookup_word(k)),
                None => element_lookup_word(s, &e.words),
            };
            match lw {
                Some(lw) => h.note(i, lw),
                None => h.note_unknown(i),
            }
        }
        let _ = leaf.state.hints.set(h);
        leaf
    }

    const VERSIONED: bool = true;

    /// A search tests the DRAM fingerprints, one byte per 32-byte element
    /// (one line of them per 32 leaf lines), and reads only the elements
    /// whose fingerprint matches: about one.
    const SEARCH_LINE_SHARE: f64 = 1.0 / 32.0;

    /// The leaf's offset and its number of compact entries (bits 48..):
    /// the compact prefix is sorted, so a key's entry lies about where its
    /// word falls between the leaf's bounds.
    fn guide<S: Space>(s: &S, leaf: &Leaf<Nv>) -> u64 {
        let compact = hints(s, leaf).compact;
        if compact > GUIDE_COUNT_MAX || leaf.off > GUIDE_OFF_MASK {
            return 1;
        }
        // Never 0 (unknown): a leaf's offset is past the pool header.
        leaf.off | compact << GUIDE_COUNT_SHIFT
    }

    #[inline]
    fn prefetch_head<S: Space>(s: &S, guide: u64) {
        if guide > 1 {
            s.prefetch_write(NvLeaf::at(guide & GUIDE_OFF_MASK).count_word());
        }
    }

    /// The compact entries around the one that interpolating `kw` between
    /// the bounds' words points at: two entries either side, at most two
    /// lines (four entries a line).
    #[inline]
    fn prefetch_guess<S: Space>(s: &S, guide: u64, lo: u64, hi: u64, kw: u64) {
        if let Some((first, last)) = guessed_entries(guide, lo, hi, kw) {
            s.prefetch(first);
            if first / LINE != last / LINE {
                s.prefetch(last);
            }
        }
    }

    fn read_ref<S: Space>(s: &S, leaf: &Leaf<Nv>, key: &[u8], at: u64) -> Option<Option<ValueRef>> {
        let n = leaf.durable.load(Ordering::Acquire);
        Some(read_stable(&leaf.state.seq, || {
            match Self::lookup_at(s, leaf, n, key, at) {
                Lookup::Present(i) => Some(ValueRef::of(s, &cached_layout(s, leaf).words(s, i))),
                Lookup::Absent => None,
            }
        }))
    }

    fn upsert<S: Space>(
        s: &S,
        leaf: &Leaf<Nv>,
        key: &[u8],
        value: &[u8],
        blob: u64,
        existing: bool,
        clock: &Clock,
    ) -> Written {
        let n = leaf.durable.load(Ordering::Relaxed);
        let layout = cached_layout(s, leaf);
        let room = nv::capacity_at(leaf.size, layout.compact);
        // The lines the append will write (the next element's and the
        // count's) are fetched while the lookup runs.
        if n < room {
            s.prefetch_write(layout.elem(n));
        }
        s.prefetch_write(NvLeaf::at(leaf.off).count_word());
        // An update appends only the new element: the newest element of a
        // key at or below a reader's timestamp decides, so the old one needs
        // no NEGATIVE twin (NV-Tree §4.3 appends one; with a commit
        // timestamp on every element it says nothing the new element does
        // not, and collation dropped it anyway). A leaf fills half as fast
        // under updates.
        let present = match Self::lookup(s, leaf, n, key) {
            Lookup::Present(i) => Some(i),
            Lookup::Absent if existing => return Written::Absent,
            Lookup::Absent => None,
        };
        // An update of a key whose newest element is a compact entry, to an
        // 8-byte value, while no snapshot can need the old value: the value
        // word is replaced in place, one failure-atomic store, one flush and
        // one fence, and the leaf does not grow (FAST-FAIR's update). The
        // entry keeps the prefix's version, which is no newer than any
        // reader's timestamp; after a crash it holds either value.
        if let Some(i) = present.filter(|&i| i < layout.compact && value.len() == 8) {
            let w = clock.begin_write();
            if clock.quiet(&w) {
                let at = layout.compact_value_word(i);
                leaf.state.in_place.fetch_max(w.ts, Ordering::AcqRel);
                store_in_place(
                    s,
                    &leaf.state.seq,
                    at,
                    inline_value_word(value),
                    points::NV_COMPACT_FLUSH,
                    points::NV_COMPACT_FENCE,
                );
                drop(w);
                return Written::Done {
                    inserted: false,
                    freed: None,
                };
            }
        }
        let present = present.is_some();
        if n + 1 > room {
            return Written::Full;
        }
        let w = clock.begin_write();
        Self::append(s, leaf, n, &[encode(key, value, blob, w.ts, false)]);
        leaf.durable.store(n + 1, Ordering::Release);
        drop(w);
        // An old blob stays referenced by the old element until a rewrite drops it.
        Written::Done {
            inserted: !present,
            freed: None,
        }
    }

    fn remove<S: Space>(s: &S, leaf: &Leaf<Nv>, key: &[u8], clock: &Clock) -> Removed {
        let n = leaf.durable.load(Ordering::Relaxed);
        // The deletion bits share the leaf's header line: fetched for
        // writing while the lookup runs (from the PLN slot's guide, before
        // the handle, when it has one), so the store below and its flush
        // do not wait for the line after it.
        s.prefetch_write(NvLeaf::at(leaf.off).count_word());
        // A NEGATIVE element is appended only when a positive one exists (§4.3).
        let Lookup::Present(i) = Self::lookup(s, leaf, n, key) else {
            return Removed::Done {
                existed: false,
                freed: None,
            };
        };
        let layout = cached_layout(s, leaf);
        // No snapshot can need the key's elements, and they all lie in one
        // word of the leaf's deletion bits: their bits are set in place, one
        // failure-atomic store, one flush and one fence, and nothing is
        // appended (FPTree's bitmap delete), so deletes do not fill the leaf.
        // The delete's timestamp is remembered as an in-place update's is.
        // Either way the delete takes one timestamp.
        let w = clock.begin_write();
        if i < nv::GONE_SLOTS && clock.quiet(&w) {
            if let Some(bits) = key_bits(s, leaf, &layout, key, i) {
                leaf.state.in_place.fetch_max(w.ts, Ordering::AcqRel);
                let slot = &hints(s, leaf).gone[(i / 64) as usize];
                let word = slot.load(Ordering::Relaxed) | bits;
                let at = layout.gone_word(i);
                write_visible(&leaf.state.seq, || {
                    s.store(at, word);
                    slot.store(word, Ordering::Relaxed);
                    s.flush(at, 8, points::NV_GONE_FLUSH);
                    s.fence(points::NV_GONE_FENCE);
                });
                drop(w);
                return Removed::Done {
                    existed: true,
                    freed: None,
                };
            }
        }
        if n + 1 > nv::capacity_at(leaf.size, layout.compact) {
            return Removed::Full;
        }
        let old = layout.words(s, i);
        Self::append(s, leaf, n, &[negate(old, w.ts, false)]);
        leaf.durable.store(n + 1, Ordering::Release);
        drop(w);
        Removed::Done {
            existed: true,
            freed: None,
        }
    }

    fn collate_leaf<S: Space>(s: &S, leaf: &Leaf<Nv>, keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated {
        let n = leaf.durable.load(Ordering::Acquire);
        read_stable(&leaf.state.seq, || collate_in(s, leaf.off, n, keep, lo, hi))
    }

    fn read_settled<T>(leaf: &Leaf<Self>, f: impl FnMut() -> T) -> T {
        read_stable(&leaf.state.seq, f)
    }

    fn has_room<S: Space>(s: &S, leaf: &Leaf<Nv>, need: u64) -> bool {
        leaf.durable.load(Ordering::Relaxed) + need <= Self::room(s, leaf)
    }

    fn lower_count<S: Space>(s: &S, leaf: u64, count: u64) {
        let w = NvLeaf::at(leaf).count_word();
        s.store(w, count);
        s.flush(w, 8, points::TXN_UNDO_FLUSH);
    }

    fn scan<S: Space>(s: &S, off: u64, committed: u64) -> std::result::Result<Scan, String> {
        let pool = crate::format::header::pool_size(s);
        let size = Self::size(s, off);
        if size < nv::MIN_SIZE || size % LINE != 0 || size > pool - off {
            return Err(format!("leaf {off} has invalid size {size}"));
        }
        let count = Self::count(s, off);
        if count > Self::max_count(size) {
            return Err(format!(
                "leaf {off} count {count} exceeds capacity {}",
                Self::max_count(size)
            ));
        }
        let layout = Layout::read(s, off);
        if !Self::layout_ok(s, off, size, count) {
            return Err(format!(
                "leaf {off} has an invalid compact prefix ({} of {count})",
                layout.compact
            ));
        }
        // A sealed leaf ends where its valid elements end; its count word
        // is behind (appends do not store it).
        let stamp = NvLeaf::at(off).stamp(s);
        let count = if stamp == 0 {
            count
        } else {
            nv::valid_end(s, &layout, stamp, nv::capacity_at(size, layout.compact))
        };
        if !layout.gone_ok(count) {
            return Err(format!("leaf {off} marks elements deleted past its {count} elements"));
        }
        let mut blobs = Vec::new();
        // Elements of a transaction without a commit record end the leaf.
        let mut kept = count;
        for i in 0..count {
            let words = layout.words(s, i);
            let meta_w = words[3];
            let meta = Meta::decode(meta_w)
                .ok_or_else(|| format!("leaf {off} element {i} has invalid metadata {meta_w:#x}"))?;
            let uncommitted = meta.txn && meta.version > committed;
            if uncommitted && kept == count {
                kept = i;
            } else if !uncommitted && kept < count {
                return Err(format!(
                    "leaf {off} element {i} follows elements of an uncommitted transaction"
                ));
            }
            if uncommitted {
                continue;
            }
            let b = words[1];
            if meta.needs_blob() {
                validate_blob(s, b, meta, pool).map_err(|w| format!("leaf {off} element {i}: {w}"))?;
                blobs.push(b);
            } else if b != 0 {
                return Err(format!("leaf {off} element {i} has a blob reference but inline data"));
            }
        }
        // Every element is valid now; collate for the leaf's bound and live keys.
        let c = collate(s, off, kept, Keep::At(u64::MAX));
        Ok(Scan {
            size,
            count: kept,
            undo: kept < count,
            max: c.max_key,
            max_version: c.max_version,
            live: c.live,
            blobs,
        })
    }

    fn recovered<S: Space>(s: &S, off: u64, count: u64, undo: bool) -> bool {
        let stamp = NvLeaf::at(off).stamp(s);
        if undo && stamp != 0 {
            // The first element cut fails its check from now on (one
            // 8-byte store: its meta word with the check bits inverted):
            // the later ones are chained to it, so none of them validates
            // again, whatever commit record comes later (and a later append
            // there breaks the chain anyway, with a newer version).
            let layout = Layout::read(s, off);
            let stored = layout.stored(s, count);
            let at = SealAt {
                leaf: off,
                stamp,
                slot: count,
                chain: layout.chain(s, count),
            };
            let meta = layout.elem(count) + nv::E_META;
            s.store(meta, nv::spoiled_meta(stored, &at));
            s.flush(meta, 8, points::TXN_UNDO_FLUSH);
        }
        // An unsealed leaf's count decides: lowered durably. A sealed
        // leaf's count word is left as it is: its count lives in DRAM until
        // a clean shutdown persists it.
        if stamp == 0 && Self::count(s, off) != count {
            let w = NvLeaf::at(off).count_word();
            s.store(w, count);
            s.flush(w, 8, points::TXN_UNDO_FLUSH);
        }
        undo
    }

    fn settle<S: Space>(s: &S, leaf: &Leaf<Nv>) {
        let n = leaf.durable.load(Ordering::Acquire);
        if NvLeaf::at(leaf.off).stamp(s) != 0 && Self::count(s, leaf.off) != n {
            let w = NvLeaf::at(leaf.off).count_word();
            s.store(w, n);
            s.flush(w, 8, points::SHUTDOWN_COUNTS_FLUSH);
        }
    }

    fn validate<S: Space>(
        s: &S,
        off: u64,
        data_start: u64,
    ) -> std::result::Result<(u64, Option<u64>), crate::format::validate::Damage> {
        crate::format::validate::nv_leaf(s, off, data_start).map(|(size, count)| (size, Some(count)))
    }

    fn audit<S: Space>(s: &S, leaf: &Leaf<Nv>, ctx: &AuditCtx<'_>) -> Audit {
        let off = leaf.off;
        let mut a = Audit::default();
        let persistent = Self::count(s, off);
        if persistent > Self::max_count(leaf.size) {
            a.problems.push(format!(
                "leaf {off}: count {persistent} exceeds capacity {}",
                Self::max_count(leaf.size)
            ));
            return a;
        }
        let layout = Layout::read(s, off);
        if !Self::layout_ok(s, off, leaf.size, persistent) {
            a.problems.push(format!(
                "leaf {off}: compact prefix of {} entries with {persistent} elements",
                layout.compact
            ));
            return a;
        }
        if (1..layout.compact).any(|i| layout.key_word(s, i - 1) >= layout.key_word(s, i)) {
            a.problems.push(format!("leaf {off}: compact prefix out of key order"));
        }
        let n = leaf.durable.load(Ordering::Acquire);
        // A read-only open cannot undo an uncommitted transaction's
        // elements; it only stops reading before them.
        let uncommitted = |from: u64, to: u64| {
            !s.writable()
                && (from..to).all(|i| {
                    let m = Meta::decode(layout.words(s, i)[3]);
                    m.is_some_and(|m| m.txn && m.version > ctx.committed)
                })
        };
        let sealed = NvLeaf::at(off).stamp(s) != 0;
        if sealed {
            // The count word of a sealed leaf is written when the leaf is
            // built and at clean shutdown only; its valid elements decide.
            let end = nv::valid_end(
                s,
                &layout,
                NvLeaf::at(off).stamp(s),
                nv::capacity_at(leaf.size, layout.compact),
            );
            if end < n {
                a.problems
                    .push(format!("leaf {off}: element {end} of {n} fails its check"));
            } else if end > n && !uncommitted(n, end) {
                a.problems
                    .push(format!("leaf {off}: {end} valid elements but a durable count of {n}"));
            }
        } else if n != persistent && !(n < persistent && uncommitted(n, persistent)) {
            a.problems.push(format!(
                "leaf {off}: durable count {n} differs from persistent count {persistent}"
            ));
        }
        if !layout.gone_ok(n) {
            a.problems
                .push(format!("leaf {off}: elements marked deleted past its {n} elements"));
        }
        let mut newest: HashMap<Vec<u8>, bool> = HashMap::new();
        let mut versions: HashMap<Vec<u8>, u64> = HashMap::new();
        for i in 0..if sealed { n } else { n.min(persistent) } {
            let words = layout.words(s, i);
            if Meta::decode(words[3]).is_none() {
                a.problems
                    .push(format!("leaf {off} element {i}: invalid metadata {:#x}", words[3]));
                continue;
            }
            if let Err(w) = leaf_blob_ok(s, &words, ctx.pool) {
                a.problems.push(format!("leaf {off} element {i}: {w}"));
                continue;
            }
            let el = Self::element(s, off, i);
            a.elements += 1;
            if el.blob() != 0 {
                a.blobs.push(el.blob());
            }
            if !(ctx.in_bounds)(&el.key) {
                a.problems.push(format!(
                    "leaf {off} element {i}: key {} outside the leaf's bounds",
                    show(&el.key)
                ));
            }
            let meta = el.meta();
            if meta.txn && meta.version > ctx.committed {
                a.problems.push(format!(
                    "leaf {off} element {i}: part of transaction {} that has no commit record",
                    meta.version
                ));
            }
            if meta.version > ctx.last_ts {
                a.problems.push(format!(
                    "leaf {off} element {i}: version {} is newer than the clock ({})",
                    meta.version, ctx.last_ts
                ));
            }
            if versions
                .insert(el.key.clone(), meta.version)
                .is_some_and(|v| v > meta.version)
            {
                a.problems.push(format!(
                    "leaf {off} element {i}: versions of key {} go backwards",
                    show(&el.key)
                ));
            }
            let neg = el.negative();
            if layout.is_gone(i) {
                // Deleted in place: every older element of its key is too.
                if newest.get(&el.key) == Some(&true) {
                    a.problems.push(format!(
                        "leaf {off} element {i}: deleted in place over a live older version of key {}",
                        show(&el.key)
                    ));
                }
            } else if neg && newest.get(&el.key) != Some(&true) {
                a.problems.push(format!(
                    "leaf {off} element {i}: NEGATIVE element without a live positive one"
                ));
            }
            newest.insert(el.key, !neg);
        }
        a.live = newest.values().filter(|v| **v).count() as u64;
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::element::write_blob;
    use crate::tree::collate::tests::{history_of, shared_word_keys, unsettled};

    #[test]
    fn the_guessed_entries_hold_evenly_spread_keys_and_stay_in_the_prefix() {
        let off = 4096u64;
        let entry = |j: u64| off + nv::ELEMS_OFF + j * nv::COMPACT_SIZE;
        for compact in [1u64, 2, 5, 30, 60] {
            let guide = off | compact << GUIDE_COUNT_SHIFT;
            // Keys 1000 + 10 j between bounds 995 (exclusive) and the last key.
            let (lo, hi) = (995, 1000 + 10 * (compact - 1));
            for j in 0..compact {
                let (first, last) = guessed_entries(guide, lo, hi, 1000 + 10 * j).expect("a guess");
                assert!(first <= entry(j) && entry(j) <= last, "compact {compact}, entry {j}");
                assert!(first >= entry(0) && last <= entry(compact - 1));
            }
            assert_eq!(guessed_entries(guide, lo, hi, lo), None, "outside the bounds");
            assert_eq!(guessed_entries(guide, lo, hi, hi + 1), None);
        }
        // No compact prefix, or the guide of a format without one: no guess.
        assert_eq!(guessed_entries(off, 0, 100, 50), None);
        assert_eq!(guessed_entries(1, 0, 100, 50), None);
        // Keys spread at random: the entry is usually in the two lines.
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let (mut hit, mut all) = (0, 0);
        for _ in 0..200 {
            let mut keys: Vec<u64> = (0..30)
                .map(|_| {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    1 + (rng >> 8)
                })
                .collect();
            keys.sort_unstable();
            let guide = off | (keys.len() as u64) << GUIDE_COUNT_SHIFT;
            for (j, &k) in keys.iter().enumerate() {
                let (first, last) = guessed_entries(guide, 0, u64::MAX >> 8, k).expect("a guess");
                hit += (first <= entry(j as u64) && entry(j as u64) <= last) as u32;
                all += 1;
            }
        }
        assert!(hit * 2 > all, "{hit} of {all} entries in the guessed span");
    }

    #[test]
    fn a_built_leafs_handle_has_the_hints_its_lines_give() {
        let s = crate::pmem::sim::SimSpace::new(1 << 20);
        let mut keys = shared_word_keys();
        keys.extend((0..40).map(|i| format!("k{i:07}").into_bytes()));
        let mut compacted = 0;
        for seed in 1..25u64 {
            let (elems, blobs) = history_of(&keys, seed, 150, 1);
            for (off, k, v) in &blobs {
                write_blob(&s, *off, k, v);
            }
            // Unsettled slots without their long keys loaded (as recovery
            // and transactions pass them), then collated ones with them
            // loaded and the settled ones marked (as a split passes them).
            let scratch = unsettled(&elems);
            Nv::build(&s, 4096, 32768, 0, &scratch);
            let kept = collate(&s, 4096, scratch.len() as u64, Keep::Since(u64::MAX)).valid;
            for (off, size, elems) in [
                (40960, 32768, &scratch[..]),
                (81920, 8192, &kept[..]),
                (90112, 1024, &kept[..kept.len().min(24)]),
            ] {
                Nv::build(&s, off, size, 0, elems);
                compacted += Layout::read(&s, off).compact;
                let seeded = Nv::handle(&s, off, size, elems);
                let read = Leaf::<Nv>::built(off, size, elems.len() as u64);
                let (got, want) = (hints(&s, &seeded).snapshot(), hints(&s, &read).snapshot());
                assert_eq!(got, want, "seed {seed}, leaf of {size} bytes");
            }
        }
        assert!(compacted > 0, "some leaves have a compact prefix");
    }

    #[test]
    fn key_table_lookups_match_a_linear_scan() {
        let s = crate::pmem::sim::SimSpace::new(1 << 20);
        let mut keys = shared_word_keys();
        keys.extend((0..40).map(|i| format!("k{i:07}").into_bytes()));
        let queries: Vec<Vec<u8>> = keys
            .iter()
            .cloned()
            .chain([&b"q"[..], b"abcdefgh333", b"k999999z", b"a\0\0"].map(|k| k.to_vec()))
            .collect();
        let (mut decided, mut asked) = (0u64, 0u64);
        for seed in 1..25u64 {
            // A leaf rebuilt from an earlier history (so 8-byte keys with
            // 8-byte values form a compact prefix), then appended to.
            let (old, old_blobs) = history_of(&keys, seed, 150, 1);
            let (new, new_blobs) = history_of(&keys, seed ^ 0x5555, 120, 1000);
            for (off, k, v) in old_blobs.iter().chain(&new_blobs) {
                write_blob(&s, *off, k, v);
            }
            let scratch = unsettled(&old);
            Nv::build(&s, 4096, 32768, 0, &scratch);
            let kept = collate(&s, 4096, scratch.len() as u64, Keep::Since(u64::MAX)).valid;
            let (off, size) = (36864, 8192);
            Nv::build(&s, off, size, 0, &kept);
            let leaf = Leaf::<Nv>::with(off, size, kept.len() as u64);
            assert!(hints(&s, &leaf).table.is_some());
            assert!(Layout::read(&s, off).compact > 0, "seed {seed}");
            let mut n = kept.len() as u64;
            for (step, (_, w)) in new.iter().enumerate() {
                Nv::append(&s, &leaf, n, &[*w]);
                n += 1;
                leaf.durable.store(n, Ordering::Release);
                if step % 7 != 0 {
                    continue;
                }
                let layout = Layout::read(&s, off);
                // A reader may hold an older count than the writer has noted.
                let oracle = |n: u64, key: &[u8], at: u64| {
                    (0..n).rev().find_map(|i| {
                        let w = layout.words(&s, i);
                        let version = w[3] & nv::VERSION_MASK;
                        (element_key(&s, &w) == key && version <= at).then_some((i, w[3] & nv::NEGATIVE != 0, version))
                    })
                };
                let t = hints(&s, &leaf).table.as_ref().unwrap();
                for (q, r) in queries.iter().flat_map(|q| [(q, n), (q, n - n.min(3))]) {
                    for at in [0, 1, 75, 149, 150, 1000, 1000 + step as u64 / 2, u64::MAX] {
                        let want = oracle(r, q, at);
                        let got = Nv::newest(&s, &leaf, r, q, at).map(|e| (e.index, e.negative, e.version));
                        assert_eq!(got, want, "seed {seed} step {step} key {q:?} at {at} count {r}");
                        let by_table = newest_by_table(&s, t, &layout, r, q, nv::key_word(q), lookup_word(q), at);
                        if let Some(by_table) = by_table {
                            assert_eq!(by_table.map(|e| (e.index, e.negative, e.version)), want);
                        }
                        if at == u64::MAX && r == n {
                            asked += 1;
                            decided += by_table.is_some() as u64;
                        }
                    }
                }
            }
        }
        // Most lookups of the newest state (a writer's) never reach the scan.
        assert!(decided * 10 > asked * 9, "table decided {decided} of {asked}");
    }
}
