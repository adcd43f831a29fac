//! Collation: a leaf's elements reduced to the versions a reader or a
//! rewrite (split, replace, merge) keeps, in key order.

use std::ops::Bound as RB;

use rustc_hash::FxHashSet;

use crate::format::element::element_key;
use crate::format::leaf_nv::{self as nv, Layout, Meta};
use crate::pmem::Space;

/// One element read for a bulk operation (split, scan, recovery): its raw
/// words and, only for keys longer than 8 bytes, the key bytes. Inline keys
/// are never materialised unless asked for.
#[derive(Clone, Debug)]
pub struct Slot {
    pub words: [u64; 4],
    pub long_key: Option<Box<[u8]>>,
    /// Set by [`Keep::Since`] on the element every present and future
    /// snapshot reads for its key (its version is at or below the oldest
    /// one): a new leaf may store it compact (see `format/leaf_nv.rs`).
    pub settled: bool,
}

impl Slot {
    pub fn negative(&self) -> bool {
        self.words[3] & nv::NEGATIVE != 0
    }
    /// Commit timestamp.
    pub fn version(&self) -> u64 {
        self.words[3] & nv::VERSION_MASK
    }
    pub fn blob(&self) -> u64 {
        self.words[1]
    }
    fn inline_len(&self) -> Option<usize> {
        Meta::decode(self.words[3])
            .expect("validated meta")
            .key_inline
            .map(|l| l as usize)
    }
    /// The full key.
    pub fn key(&self) -> Vec<u8> {
        match &self.long_key {
            Some(k) => k.to_vec(),
            None => nv::word_key(self.words[0], self.inline_len().unwrap_or(0)),
        }
    }
    /// Runs `f` on the full key, without allocating.
    #[inline]
    pub fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &self.long_key {
            Some(k) => f(k),
            None => f(&self.words[0].to_be_bytes()[..self.inline_len().unwrap_or(0)]),
        }
    }
    /// Order of this element's key relative to `key`, without allocating.
    pub fn cmp_bytes(&self, key: &[u8]) -> std::cmp::Ordering {
        match &self.long_key {
            Some(k) => k.as_ref().cmp(key),
            None => {
                let w = self.words[0].to_be_bytes();
                w[..self.inline_len().unwrap_or(0)].cmp(key)
            }
        }
    }

    /// Whether the value is in a blob.
    pub fn value_in_blob(&self) -> bool {
        Meta::decode(self.words[3])
            .expect("validated meta")
            .value_inline
            .is_none()
    }

    /// The value, if it is inline (no pool access needed).
    pub fn inline_value(&self) -> Option<Vec<u8>> {
        let meta = Meta::decode(self.words[3]).expect("validated meta");
        meta.value_inline
            .map(|l| self.words[2].to_le_bytes()[..l as usize].to_vec())
    }

    /// Whether the key lies in `[lo, hi]`.
    pub fn in_range(&self, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> bool {
        use std::cmp::Ordering::*;
        let above = match lo {
            RB::Unbounded => true,
            RB::Included(l) => self.cmp_bytes(l) != Less,
            RB::Excluded(l) => self.cmp_bytes(l) == Greater,
        };
        above
            && match hi {
                RB::Unbounded => true,
                RB::Included(h) => self.cmp_bytes(h) != Greater,
                RB::Excluded(h) => self.cmp_bytes(h) == Less,
            }
    }

    /// Bytewise key order, deciding on the prefix word where it can.
    pub fn key_cmp(&self, other: &Slot) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match self.words[0].cmp(&other.words[0]) {
            Ordering::Equal => {}
            o => return o,
        }
        // Equal words: an inline key is a prefix of any longer key with the same word.
        match (&self.long_key, &other.long_key) {
            (None, None) => self.inline_len().cmp(&other.inline_len()),
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) => a.cmp(b),
        }
    }
}

/// Which versions [`collate`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Per key, the newest element with `version <= ts`, if positive: what a
    /// reader at `ts` sees (`u64::MAX`: the latest state).
    At(u64),
    /// Per key, every element a snapshot at `oldest` or later can need: the
    /// newest with `version <= oldest` and all newer ones, without leading
    /// NEGATIVE elements and without the NEGATIVE half of an update (what a
    /// split, replace or merge writes into the new leaves).
    Since(u64),
}

/// A leaf's elements collated: the elements kept, in key order (a key's
/// versions oldest first), and what is left behind.
pub struct Collated {
    pub valid: Vec<Slot>,
    /// Keys whose newest element is positive (the leaf's live keys).
    pub live: u64,
    /// Blobs referenced only by elements that are not kept.
    pub dropped_blobs: Vec<u64>,
    /// Largest key among all elements (negative ones too), for recovery bounds.
    pub max_key: Option<Vec<u8>>,
    /// Largest version among all elements.
    pub max_version: u64,
}

/// Reads elements `0..n` of a leaf and collates them: one stable sort by key
/// (equal keys stay in append order, which is version order), then each run
/// of equal keys is reduced as `keep` says.
pub fn collate<S: Space>(s: &S, leaf: u64, n: u64, keep: Keep) -> Collated {
    collate_in(s, leaf, n, keep, &RB::Unbounded, &RB::Unbounded)
}

/// A leaf's worth of elements (a leaf of 1 KB holds at most 60): up to
/// this many, [`collate_in`] sorts them all in place ([`key_order`]);
/// above it, it first leaves out the versions no snapshot reads and sorts
/// positions instead of slots.
const SMALL: u64 = 64;

/// [`collate`] restricted to keys in `[lo, hi]`: elements outside are
/// skipped before they are sorted, mostly on their key word alone (a narrow
/// scan, such as a prefix, sorts only what it returns). `max_key` and `live`
/// then describe the keys in range only.
pub fn collate_in<S: Space>(s: &S, leaf: u64, n: u64, keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated {
    // Key-word bounds: a key whose word is below `lo`'s word is below `lo`
    // (words order keys by their first 8 bytes), likewise above `hi`.
    let lo_word = match lo {
        RB::Included(k) | RB::Excluded(k) => nv::key_word(k),
        RB::Unbounded => 0,
    };
    let hi_word = match hi {
        RB::Included(k) | RB::Excluded(k) => nv::key_word(k),
        RB::Unbounded => u64::MAX,
    };
    let bounded = !matches!((lo, hi), (RB::Unbounded, RB::Unbounded));
    // Most of a hot leaf's elements are left out below: a buffer for all
    // of them would be a large allocation per rewrite for nothing.
    let mut all: Vec<Slot> = Vec::with_capacity((n as usize).min(256));
    let layout = Layout::read(s, leaf);
    // Per key, every element older than the newest one at or below `bar`
    // is read by no snapshot `keep` serves: it is left out before the sort
    // (a hot leaf holds hundreds of versions of a few keys). Elements with
    // a blob stay, so the blobs of the ones dropped are found below; long
    // keys stay too (their identity needs the key bytes).
    let bar = match keep {
        Keep::At(ts) | Keep::Since(ts) => ts,
    };
    // Only worth its hashing in a leaf that can hold many versions of a
    // key: below this many elements the sort below is cheaper than the
    // set, and what is kept does not depend on it (the per-key pass after
    // the sort drops the same elements).
    let filter = n > SMALL;
    let mut settled: FxHashSet<(u64, u8)> = FxHashSet::default();
    for i in (0..n).rev() {
        if bounded {
            let kw = layout.key_word(s, i);
            if kw < lo_word || kw > hi_word {
                continue;
            }
        }
        let words = layout.words(s, i);
        let long_key = match Meta::decode(words[3])
            .expect("published element has valid meta")
            .key_inline
        {
            Some(len) if filter => {
                let key = (words[0], len);
                if words[1] == 0 && settled.contains(&key) {
                    continue;
                }
                if words[3] & nv::VERSION_MASK <= bar {
                    settled.insert(key);
                }
                None
            }
            Some(_) => None,
            None => Some(element_key(s, &words).into_boxed_slice()),
        };
        let slot = Slot {
            words,
            long_key,
            settled: false,
        };
        if bounded && !slot.in_range(lo, hi) {
            continue;
        }
        all.push(slot);
    }
    all.reverse(); // append order
    let all = key_order(all);
    let max_key = all.last().map(|x| x.key());
    let max_version = all.iter().map(|x| x.version()).max().unwrap_or(0);
    let mut valid = Vec::with_capacity(all.len());
    let mut live = 0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j].key_cmp(&all[i]).is_eq() {
            j += 1;
        }
        let run = &all[i..j];
        if !run[run.len() - 1].negative() {
            live += 1;
        }
        match keep {
            Keep::At(ts) => {
                if let Some(e) = run.iter().rev().find(|e| e.version() <= ts) {
                    if !e.negative() {
                        valid.push(e.clone());
                    }
                }
            }
            Keep::Since(oldest) => {
                let from = run.iter().rposition(|e| e.version() <= oldest).unwrap_or(0);
                let mut kept = run[from..].iter().enumerate().filter(|(k, e)| {
                    // The NEGATIVE half of an update says nothing its
                    // positive twin (same version, next) does not.
                    !(e.negative() && run[from..].get(k + 1).is_some_and(|n| n.version() == e.version()))
                });
                let mut started = false;
                for (k, e) in kept.by_ref() {
                    if !started && e.negative() {
                        continue; // absent is what no element says too
                    }
                    started = true;
                    let mut e = e.clone();
                    // Committed: the flag has done its work.
                    e.words[3] &= !nv::TXN;
                    // Only the newest element at or below `oldest` is read by
                    // every snapshot; the ones after it are newer.
                    e.settled = k == 0 && e.version() <= oldest;
                    valid.push(e);
                }
            }
        }
        i = j;
    }
    // A rewrite drops the blobs no kept element refers to.
    let mut dropped = Vec::new();
    if matches!(keep, Keep::Since(_)) && all.iter().any(|e| e.blob() != 0) {
        let kept: std::collections::HashSet<u64> = valid.iter().map(|e| e.blob()).filter(|&b| b != 0).collect();
        dropped = all
            .iter()
            .map(|e| e.blob())
            .filter(|&b| b != 0 && !kept.contains(&b))
            .collect();
        dropped.sort_unstable();
        dropped.dedup();
    }
    Collated {
        valid,
        live,
        dropped_blobs: dropped,
        max_key,
        max_version,
    }
}

/// `slots` (in append order) stably sorted by key: equal keys stay in
/// append order, which is version order.
///
/// Up to [`SMALL`] slots (a split of a leaf of 1 or 2 KB) are sorted
/// in place by a stable sort on the key word, which took about half as long
/// as the two buffers below (`bench micro --op insert`, the splits of 1M
/// inserts: 21 ms against 38 ms, BENCHMARKS.md).
///
/// A rewrite collates a whole leaf, and an enlarged leaf holds hundreds of
/// versions of a few keys, so this is the rewrite's main cost. Positions
/// are sorted as plain integers (key word, then position) and the slots are
/// moved once; only a run of one key word that holds several keys (inline
/// keys of different lengths, long keys sharing their first 8 bytes) needs
/// [`Slot::key_cmp`], and a stable sort of that run alone (it is in append
/// order) gives what one stable sort by `key_cmp` gives.
fn key_order(mut slots: Vec<Slot>) -> Vec<Slot> {
    let mut sorted = if slots.len() as u64 <= SMALL {
        // A leaf's worth of slots: a stable sort in place (its scratch on
        // the stack) moves them fewer times than the two buffers below.
        slots.sort_by_key(|e| e.words[0]);
        slots
    } else {
        let mut order: Vec<u128> = slots
            .iter()
            .enumerate()
            .map(|(p, e)| (e.words[0] as u128) << 64 | p as u128)
            .collect();
        order.sort_unstable();
        order
            .iter()
            .map(|&o| {
                let hole = Slot {
                    words: [0; 4],
                    long_key: None,
                    settled: false,
                };
                std::mem::replace(&mut slots[o as u64 as usize], hole)
            })
            .collect::<Vec<Slot>>()
    };
    let mut i = 0;
    while i < sorted.len() {
        let w = sorted[i].words[0];
        let mut j = i + 1;
        while j < sorted.len() && sorted[j].words[0] == w {
            j += 1;
        }
        let run = &mut sorted[i..j];
        if run.len() > 1 && run.iter().any(|e| e.key_cmp(&run[0]).is_ne()) {
            run.sort_by(|a, b| a.key_cmp(b));
        }
        i = j;
    }
    sorted
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::element::{blob_size, encode, negate, write_blob};
    use crate::tree::leaf::LeafFormat;
    use crate::tree::nv::Nv;
    use std::collections::HashMap;

    /// Elements of a leaf, in append order (key and words), and the blobs
    /// they name (offset, key, value).
    pub(crate) type Blobs = Vec<(u64, Vec<u8>, Vec<u8>)>;
    pub(crate) type Elements = Vec<(Vec<u8>, [u64; 4])>;
    pub(crate) fn history(seed: u64, steps: usize) -> (Elements, Blobs) {
        history_of(&shared_word_keys(), seed, steps, 1)
    }

    /// Keys that share key words: inline keys that are prefixes of each
    /// other, and long keys with the same first 8 bytes.
    pub(crate) fn shared_word_keys() -> Vec<Vec<u8>> {
        [
            &b"a"[..],
            b"a\0",
            b"ab",
            b"abcdefgh",
            b"abcdefgh1",
            b"abcdefgh22",
            b"zz",
            b"m",
        ]
        .iter()
        .map(|k| k.to_vec())
        .collect()
    }

    /// Random writes and deletes of `keys` at versions from `first_ts`, as
    /// the elements they append, in order.
    pub(crate) fn history_of(keys: &[Vec<u8>], seed: u64, steps: usize, first_ts: u64) -> (Elements, Blobs) {
        let mut x = seed | 1;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut newest: HashMap<Vec<u8>, [u64; 4]> = HashMap::new();
        let mut out = Vec::new();
        let mut blobs = Vec::new();
        let mut blob = (1 << 16) + (first_ts - 1) * 256;
        for ts in first_ts..first_ts + steps as u64 {
            let k = keys[rnd(keys.len() as u64) as usize].clone();
            let old = newest.get(&k).copied();
            if rnd(4) == 0 {
                if let Some(o) = old {
                    let neg = negate(o, ts, false);
                    out.push((k.clone(), neg));
                    newest.remove(&k);
                }
                continue;
            }
            let v: Vec<u8> = if rnd(3) == 0 { vec![7; 12] } else { vec![ts as u8; 8] };
            let b = match blob_size(&k, &v) {
                Some(sz) => {
                    blob += sz.next_multiple_of(64);
                    blobs.push((blob, k.clone(), v.clone()));
                    blob
                }
                None => 0,
            };
            let new = encode(&k, &v, b, ts, false);
            if let Some(o) = old {
                out.push((k.clone(), negate(o, ts, false)));
            }
            out.push((k.clone(), new));
            newest.insert(k, new);
        }
        (out, blobs)
    }

    /// Elements as slots to build a leaf from, none settled.
    pub(crate) fn unsettled(elems: &Elements) -> Vec<Slot> {
        elems
            .iter()
            .map(|(_, w)| Slot {
                words: *w,
                long_key: None,
                settled: false,
            })
            .collect()
    }

    /// What `collate` keeps, computed key by key from the append order.
    fn expected(elems: &[(Vec<u8>, [u64; 4])], keep: Keep) -> Vec<([u64; 4], bool)> {
        let mut by_key: std::collections::BTreeMap<Vec<u8>, Vec<[u64; 4]>> = Default::default();
        for (k, w) in elems {
            by_key.entry(k.clone()).or_default().push(*w);
        }
        let version = |w: &[u64; 4]| w[3] & nv::VERSION_MASK;
        let negative = |w: &[u64; 4]| w[3] & nv::NEGATIVE != 0;
        let mut out = Vec::new();
        for run in by_key.values() {
            match keep {
                Keep::At(ts) => {
                    if let Some(w) = run.iter().rev().find(|w| version(w) <= ts) {
                        if !negative(w) {
                            out.push((*w, false));
                        }
                    }
                }
                Keep::Since(oldest) => {
                    let from = run.iter().rposition(|w| version(w) <= oldest).unwrap_or(0);
                    let tail = &run[from..];
                    let mut started = false;
                    for (k, w) in tail.iter().enumerate() {
                        let update_half = negative(w) && tail.get(k + 1).is_some_and(|n| version(n) == version(w));
                        if update_half || (!started && negative(w)) {
                            continue;
                        }
                        started = true;
                        out.push((*w, k == 0 && version(w) <= oldest));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn collate_keeps_what_each_key_history_says() {
        let s = crate::pmem::sim::SimSpace::new(1 << 20);
        // Long histories (hundreds of elements: the versions no snapshot
        // reads are left out before the sort) and short ones (a leaf's
        // worth, on both sides of `SMALL`: sorted in place, nothing
        // left out early).
        let runs = (1..40u64)
            .map(|seed| (seed, 200))
            .chain((1..40u64).map(|seed| (seed, 8 + seed as usize)));
        for (seed, steps) in runs {
            let (elems, blobs) = history(seed, steps);
            for (off, k, v) in &blobs {
                write_blob(&s, *off, k, v);
            }
            let slots = unsettled(&elems);
            let (leaf, size) = (4096, 32768);
            Nv::build(&s, leaf, size, 0, &slots);
            let top = elems.len() as u64;
            for bar in [0, 1, top / 3, top / 2, top, u64::MAX] {
                for keep in [Keep::At(bar), Keep::Since(bar)] {
                    let c = collate(&s, leaf, elems.len() as u64, keep);
                    let got: Vec<([u64; 4], bool)> = c.valid.iter().map(|e| (e.words, e.settled)).collect();
                    let want = expected(&elems, keep);
                    assert_eq!(got, want, "seed {seed} keep {keep:?}");
                    assert_eq!(c.max_key, elems.iter().map(|(k, _)| k.clone()).max());
                    let live = expected(&elems, Keep::At(u64::MAX)).len() as u64;
                    assert_eq!(c.live, live, "seed {seed}");
                    if let Keep::Since(_) = keep {
                        let kept: std::collections::HashSet<u64> = c.valid.iter().map(|e| e.blob()).collect();
                        let mut dropped: Vec<u64> = elems
                            .iter()
                            .map(|(_, w)| w[1])
                            .filter(|&b| b != 0 && !kept.contains(&b))
                            .collect();
                        dropped.sort_unstable();
                        dropped.dedup();
                        assert_eq!(c.dropped_blobs, dropped, "seed {seed} keep {keep:?}");
                    }
                }
            }
        }
    }
}
