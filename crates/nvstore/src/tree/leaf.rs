//! The leaf-format trait (docs/design.md, "Write paths") and the `nv` format (NV-Tree §4.3–4.4).
//!
//! The tree, recovery, `check` and the crash tests are generic over
//! [`LeafFormat`]; a format decides how elements sit in a leaf, how an append
//! is made durable and published, and how a new leaf is built for a split.

use std::ops::Bound as RB;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashSet;

use super::mvcc::Clock;
use super::LeafRef;
use crate::format::blob;
use crate::format::leaf_nv::{self as nv, Layout, Meta};
use crate::format::validate::Damage;
use crate::pmem::{points, Space, LINE};

/// One element as stored: its full key (loaded) and its raw words.
#[derive(Clone, Debug)]
pub struct Elem {
    pub key: Vec<u8>,
    pub words: [u64; 4],
}

impl Elem {
    pub fn meta(&self) -> Meta {
        Meta::decode(self.words[3]).expect("element meta validated on load")
    }
    pub fn negative(&self) -> bool {
        self.words[3] & nv::NEGATIVE != 0
    }
    pub fn blob(&self) -> u64 {
        self.words[1]
    }
}

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
    let mut settled: FxHashSet<(u64, u8)> = FxHashSet::with_capacity_and_hasher(64, Default::default());
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
            Some(len) => {
                let key = (words[0], len);
                if words[1] == 0 && settled.contains(&key) {
                    continue;
                }
                if words[3] & nv::VERSION_MASK <= bar {
                    settled.insert(key);
                }
                None
            }
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
/// A rewrite collates a whole leaf, and an enlarged leaf holds hundreds of
/// versions of a few keys, so this is the rewrite's main cost. Positions
/// are sorted as plain integers (key word, then position) and the slots are
/// moved once; only a run of one key word that holds several keys (inline
/// keys of different lengths, long keys sharing their first 8 bytes) needs
/// [`Slot::key_cmp`], and a stable sort of that run alone (it is in append
/// order) gives what one stable sort by `key_cmp` gives.
fn key_order(mut slots: Vec<Slot>) -> Vec<Slot> {
    let mut order: Vec<u128> = slots
        .iter()
        .enumerate()
        .map(|(p, e)| (e.words[0] as u128) << 64 | p as u128)
        .collect();
    order.sort_unstable();
    let mut sorted: Vec<Slot> = order
        .iter()
        .map(|&o| {
            let hole = Slot {
                words: [0; 4],
                long_key: None,
                settled: false,
            };
            std::mem::replace(&mut slots[o as u64 as usize], hole)
        })
        .collect();
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

/// What a leaf search found for a key.
pub enum Lookup {
    /// The newest element for the key is positive, at this index.
    Present(u64),
    /// The key was deleted or never written here.
    Absent,
}

/// The newest element of a key visible at some timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Newest {
    pub index: u64,
    pub negative: bool,
    pub version: u64,
}

/// A leaf layout.
pub trait LeafFormat: Send + Sync + 'static {
    const NAME: &'static str;

    /// Elements a leaf of `size` bytes holds.
    fn capacity(size: u64) -> u64;
    /// Published element count (persistent).
    fn count<S: Space>(s: &S, leaf: u64) -> u64;
    fn next<S: Space>(s: &S, leaf: u64) -> u64;
    /// Byte size recorded in the leaf.
    fn size<S: Space>(s: &S, leaf: u64) -> u64;
    /// Offset of the word that links the leaf to its right sibling.
    fn next_word(leaf: u64) -> u64;

    /// Whether the leaf's own layout words agree with its size and its
    /// `count` (recovery and `check` read them from a possibly damaged pool).
    fn layout_ok<S: Space>(_s: &S, _leaf: u64, _size: u64, _count: u64) -> bool {
        true
    }

    /// Newest element for `key` among the first `n` whose version is at
    /// most `at` (positive or NEGATIVE).
    fn newest<S: Space>(s: &S, leaf: &LeafRef, n: u64, key: &[u8], at: u64) -> Option<Newest>;

    /// What a reader at `at` finds for `key` among the first `n` elements.
    #[inline]
    fn lookup_at<S: Space>(s: &S, leaf: &LeafRef, n: u64, key: &[u8], at: u64) -> Lookup {
        match Self::newest(s, leaf, n, key, at) {
            Some(e) if !e.negative => Lookup::Present(e.index),
            _ => Lookup::Absent,
        }
    }

    /// The newest state of `key` among the first `n` elements.
    #[inline]
    fn lookup<S: Space>(s: &S, leaf: &LeafRef, n: u64, key: &[u8]) -> Lookup {
        Self::lookup_at(s, leaf, n, key, u64::MAX)
    }
    /// Reads element `i` (key loaded from the blob if needed).
    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem;
    /// The value of element `i`.
    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8>;

    /// Appends `elems` after the first `n` and publishes them with one
    /// count store: write, flush, fence, store count, flush, fence. The
    /// caller holds the leaf lock and then raises `leaf.durable`.
    fn append<S: Space>(s: &S, leaf: &LeafRef, n: u64, elems: &[[u64; 4]]);

    /// Writes a complete new leaf (unlinked, flushed but not fenced: the
    /// caller fences once for all new leaves of a split).
    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]);

    /// Whether elements carry versions (snapshots, transactions and write
    /// batches need them).
    const VERSIONED: bool;

    /// Whether a split keeps the left half in place ([`LeafFormat::split_in_place`]).
    const SPLITS_IN_PLACE: bool = false;

    /// The share of a leaf's lines one search reads, for the adaptive
    /// model's in-node search cost ([`super::adaptive::Model::t_scan`]):
    /// 1 for a search that reads every element.
    const SEARCH_LINE_SHARE: f64 = 1.0;

    /// [`LeafFormat::build`] of a leaf that replaces one whose `low` (the
    /// bound a STALE predecessor filters by) was `low`.
    fn build_with_low<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot], _low: u64) {
        Self::build(s, leaf, size, next, elems)
    }

    /// The value a predecessor's next word gets when a new leaf at
    /// `new_off` replaces its successor (`old` the word before).
    fn relink(_old: u64, new_off: u64) -> u64 {
        new_off
    }

    /// The leaf's `low` bound (0 for formats without one).
    fn low<S: Space>(_s: &S, _leaf: u64) -> u64 {
        0
    }

    /// Split in place: `right` (the upper part of the leaf's elements,
    /// already built into the fenced new leaf `new_off`) leaves `leaf`.
    /// Links the new leaf and drops the moved elements, durably.
    fn split_in_place<S: Space>(_s: &S, _leaf: &LeafRef, _new_off: u64, _right: &[Slot]) {
        unreachable!("{} leaves split by copying", Self::NAME)
    }

    /// Reads `key` as of `at` with the format's reader protocol (no lock);
    /// `None` when the key has moved to another leaf (route again).
    fn read<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], at: u64) -> Option<Option<Vec<u8>>>;

    /// Inserts or updates `key` (the caller holds the leaf lock and checked
    /// it is not dead); durable and visible when it returns `Done`.
    fn upsert<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], value: &[u8], blob: u64, clock: &Clock) -> Written;

    /// Elements a write takes in a leaf, for the adaptive profile: an
    /// insert appends one, an update two (a NEGATIVE and the new element,
    /// NV-Tree Table 3).
    fn appended(inserted: bool) -> u64 {
        if inserted {
            1
        } else {
            2
        }
    }

    /// Removes `key` (leaf lock held, as for [`LeafFormat::upsert`]).
    fn remove<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], clock: &Clock) -> Removed;

    /// The leaf's elements in `[lo, hi]` collated as `keep` says, read with
    /// the format's reader protocol (or under the leaf lock).
    fn collate_leaf<S: Space>(s: &S, leaf: &LeafRef, keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated;

    /// Whether a new leaf of `size` bytes holds `elems` with room for
    /// `extra` more.
    fn fits(size: u64, elems: &[Slot], extra: u64) -> bool {
        Self::capacity(size) >= elems.len() as u64 + extra
    }

    /// Whether a leaf has room for `need` more elements (a split that lost
    /// a race finds room made by another).
    fn has_room<S: Space>(s: &S, leaf: &LeafRef, need: u64) -> bool;

    /// Recovery: validates the leaf at `off` and gathers what the rebuild
    /// needs (`committed`: the header's commit record).
    fn scan<S: Space>(s: &S, off: u64, committed: u64) -> std::result::Result<Scan, String>;

    /// `check`: every invariant of one leaf the format owns.
    fn audit<S: Space>(s: &S, leaf: &LeafRef, ctx: &AuditCtx<'_>) -> Audit;

    /// Checks the leaf at `off` read from media (`format::validate`):
    /// its size and, for formats that have one, its persistent count.
    fn validate<S: Space>(s: &S, off: u64, data_start: u64) -> std::result::Result<(u64, Option<u64>), Damage>;
}

/// Outcome of [`LeafFormat::upsert`].
pub enum Written {
    /// Done: whether the key was new, and a blob no element refers to any more.
    Done { inserted: bool, freed: Option<u64> },
    /// No room: split first.
    Full,
    /// The key has moved to another leaf: route again.
    Moved,
}

/// Outcome of [`LeafFormat::remove`].
pub enum Removed {
    Done { existed: bool, freed: Option<u64> },
    Full,
    Moved,
}

/// A leaf as recovery found it.
pub struct Scan {
    pub size: u64,
    /// Elements to keep published (below the persistent count when an
    /// uncommitted transaction's elements end the leaf).
    pub count: u64,
    /// The count must be lowered durably to `count`.
    pub undo: bool,
    pub max: Option<Vec<u8>>,
    pub max_version: u64,
    /// Live keys.
    pub live: u64,
    pub blobs: Vec<u64>,
}

/// What [`LeafFormat::audit`] knows of the pool.
pub struct AuditCtx<'a> {
    pub pool: u64,
    pub committed: u64,
    pub last_ts: u64,
    /// Whether a key lies inside the leaf's bounds.
    pub in_bounds: &'a dyn Fn(&[u8]) -> bool,
}

/// What [`LeafFormat::audit`] found.
#[derive(Default)]
pub struct Audit {
    pub elements: u64,
    pub live: u64,
    pub blobs: Vec<u64>,
    pub problems: Vec<String>,
}

/// The NV-Tree leaf: unsorted, append-only, published by its count.
pub struct Nv;

/// DRAM hints of an nv leaf: its layout words and one fingerprint byte per
/// element slot, so a lookup reads from the leaf only the elements whose
/// fingerprint matches its key (an unsorted leaf is otherwise scanned
/// whole, and the lines its appends flushed are usually out of the cache).
/// Never persisted: built from the leaf on first use (published elements
/// never change), and extended by appends before they publish, so a
/// reader that sees an element sees its fingerprint. A slot whose
/// fingerprint is unknown (0: appended by a writer that ran while a reader
/// was building the hints) is read like any other.
pub struct Hints {
    compact: u64,
    compact_version: u64,
    /// Eight fingerprints per word (element `i` in byte `i % 8` of word
    /// `i / 8`), so a lookup tests eight elements at once.
    fp: Box<[std::sync::atomic::AtomicU64]>,
    /// Leaves of more than [`KeyTable::MIN_CAPACITY`] elements (enlarged
    /// ones, mostly) also map each key word to its newest element, so a
    /// lookup there reads one table slot and one element instead of
    /// scanning fingerprints back to the key's last write.
    table: Option<KeyTable>,
}

/// Key word → index of the newest element with that key word, for one
/// leaf: open addressing with linear probing over one `u32` per slot (a
/// 16-bit tag of the key word's hash and the index plus one; 0 is empty),
/// at least two slots per element so probes stay short. Entries are only
/// added or moved to newer elements, by the leaf's one writer before its
/// count publishes them; readers probe without locks. Every answer is
/// checked against the element it names, and anything the table cannot
/// decide (a shared key word, a tag collision, a version newer than the
/// reader's snapshot, an element not yet published) falls back to the
/// fingerprint scan, so the table only ever makes a lookup shorter.
struct KeyTable {
    slots: Box<[std::sync::atomic::AtomicU32]>,
    mask: usize,
    /// Elements `0..noted` have all been noted, in order.
    noted: AtomicU64,
    /// An element was noted out of order: the table may miss elements
    /// and is no longer used.
    gap: std::sync::atomic::AtomicBool,
}

impl KeyTable {
    /// Leaves holding at most this many elements scan their fingerprints
    /// (at most sixteen words, two lines) and keep no table.
    const MIN_CAPACITY: u64 = 128;

    fn new(capacity: u64) -> Option<KeyTable> {
        // Indices and the empty mark share 16 bits.
        if capacity <= Self::MIN_CAPACITY || capacity >= u16::MAX as u64 {
            return None;
        }
        let len = (2 * capacity).next_power_of_two() as usize;
        Some(KeyTable {
            slots: (0..len).map(|_| Default::default()).collect(),
            mask: len - 1,
            noted: AtomicU64::new(0),
            gap: Default::default(),
        })
    }

    /// The home slot and tag of key word `kw`.
    #[inline]
    fn place(&self, kw: u64) -> (usize, u32) {
        // A full 64-bit mix (murmur3's finaliser): key words of
        // sequential keys differ only in their low bytes.
        let mut h = kw;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        ((h >> 32) as usize & self.mask, (h as u32) & 0xffff)
    }

    /// The index the slot of `kw`'s tag names, if any.
    #[inline]
    fn find(&self, kw: u64) -> Option<u64> {
        let (mut p, tag) = self.place(kw);
        loop {
            let e = self.slots[p].load(Ordering::Relaxed);
            if e == 0 {
                return None;
            }
            if e >> 16 == tag {
                return Some((e & 0xffff) as u64 - 1);
            }
            p = (p + 1) & self.mask;
        }
    }

    /// Element `i` has key word `kw` (the writer, before publishing it).
    #[inline]
    fn note(&self, i: u64, kw: u64) {
        let (mut p, tag) = self.place(kw);
        loop {
            let e = self.slots[p].load(Ordering::Relaxed);
            if e == 0 || e >> 16 == tag {
                self.slots[p].store(tag << 16 | (i + 1) as u32, Ordering::Relaxed);
                break;
            }
            p = (p + 1) & self.mask;
        }
        let noted = self.noted.load(Ordering::Relaxed);
        if i == noted {
            self.noted.store(i + 1, Ordering::Relaxed);
        } else if i > noted {
            self.gap.store(true, Ordering::Relaxed);
        }
    }

    /// The table has noted every element below `n` (which the caller read
    /// from the leaf's published count, so the notes are visible).
    #[inline]
    fn covers(&self, n: u64) -> bool {
        n <= self.noted.load(Ordering::Relaxed) && !self.gap.load(Ordering::Relaxed)
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The high bit of each zero byte of `v`.
#[inline]
fn zero_bytes(v: u64) -> u64 {
    !(((v & LOW7).wrapping_add(LOW7)) | v | LOW7)
}

impl Hints {
    fn layout(&self, leaf: u64) -> Layout {
        Layout {
            leaf,
            compact: self.compact,
            compact_version: self.compact_version,
        }
    }

    /// The elements in `lo..hi` that may hold a key with fingerprint `fk`
    /// (it matches or is unknown), highest first, until `f` says stop.
    #[inline]
    fn candidates(&self, lo: u64, hi: u64, fk: u8, mut f: impl FnMut(u64) -> bool) {
        if lo >= hi {
            return;
        }
        let pat = fk as u64 * ONES;
        let mut wi = (hi - 1) / 8;
        loop {
            let w = self.fp[wi as usize].load(Ordering::Relaxed);
            let base = wi * 8;
            let mut m = zero_bytes(w ^ pat) | zero_bytes(w);
            if hi - base < 8 {
                m &= (1u64 << ((hi - base) * 8)) - 1;
            }
            if lo > base {
                m &= !((1u64 << ((lo - base) * 8)) - 1);
            }
            while m != 0 {
                let bit = 63 - m.leading_zeros() as u64;
                if f(base + bit / 8) {
                    return;
                }
                m ^= 1 << bit;
            }
            if wi == lo / 8 {
                return;
            }
            wi -= 1;
        }
    }

    /// Element `i` has key word `kw`: the caller is the one writer of the
    /// leaf (or builds the hints), before the count publishes element `i`.
    #[inline]
    fn note(&self, i: u64, kw: u64) {
        let word = &self.fp[(i / 8) as usize];
        let shift = (i % 8) * 8;
        let w = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(w | (fingerprint(kw) as u64) << shift, Ordering::Relaxed);
        if let Some(t) = &self.table {
            t.note(i, kw);
        }
    }
}

/// A key word's fingerprint: 1..=255 (0 means unknown).
#[inline]
fn fingerprint(kw: u64) -> u8 {
    ((kw.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) % 255 + 1) as u8
}

/// The leaf's hints, built on first use.
fn hints<'a, S: Space>(s: &S, leaf: &'a LeafRef) -> &'a Hints {
    leaf.hints.get_or_init(|| {
        let layout = Layout::read(s, leaf.off);
        let cap = nv::capacity(s.read_u64(leaf.off + nv::SIZE_OFF)).max(leaf.durable.load(Ordering::Relaxed));
        let fp: Box<[std::sync::atomic::AtomicU64]> = (0..cap.div_ceil(8)).map(|_| Default::default()).collect();
        let h = Hints {
            compact: layout.compact,
            compact_version: layout.compact_version,
            fp,
            table: KeyTable::new(cap),
        };
        // Elements published now; any appended later note their own (or,
        // if their writer missed these hints, stay unknown).
        let n = leaf.durable.load(Ordering::Acquire);
        for i in 0..n {
            h.note(i, layout.key_word(s, i));
        }
        h
    })
}

/// The leaf's layout from its hints: reading elements through it reads no
/// header line (which the last append flushed out of the cache).
fn cached_layout<S: Space>(s: &S, leaf: &LeafRef) -> Layout {
    hints(s, leaf).layout(leaf.off)
}

/// Full element `i` as the newest for `key` (key word `kw`) at `at`, if it
/// holds that key and is visible at `at`.
#[inline]
fn full_match<S: Space>(s: &S, layout: &Layout, i: u64, key: &[u8], kw: u64, at: u64) -> Option<Newest> {
    let e = layout.elem(i);
    if s.read_u64(e + nv::E_KEY_WORD) != kw {
        return None;
    }
    let meta_w = s.read_u64(e + nv::E_META);
    if meta_w & nv::VERSION_MASK > at {
        return None;
    }
    let meta = Meta::decode(meta_w).expect("published element has valid meta");
    let same = match meta.key_inline {
        Some(l) => l as usize == key.len(),
        None => {
            key.len() > 8 && {
                let b = s.read_u64(e + nv::E_BLOB);
                let (kl, _) = blob::lens(s.read_u64(b));
                kl as usize == key.len() && {
                    let mut k = vec![0u8; key.len()];
                    s.read(b + blob::DATA_OFF, &mut k);
                    k == key
                }
            }
        }
    };
    same.then_some(Newest {
        index: i,
        negative: meta.negative,
        version: meta.version,
    })
}

/// The newest element for `key` among the first `n` at `at`, from the key
/// table: `Some(answer)` when the table decides, `None` when the
/// fingerprint scan must.
#[inline]
fn newest_by_table<S: Space>(
    s: &S,
    t: &KeyTable,
    layout: &Layout,
    n: u64,
    key: &[u8],
    kw: u64,
    at: u64,
) -> Option<Option<Newest>> {
    if !t.covers(n) {
        return None;
    }
    // No element below `n` has this key word.
    let Some(i) = t.find(kw) else {
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
#[inline]
fn compact_match<S: Space>(s: &S, layout: &Layout, i: u64, key: &[u8], kw: u64, at: u64) -> Option<Newest> {
    let hit = key.len() == 8 && layout.compact_version <= at && layout.key_word(s, i) == kw;
    hit.then_some(Newest {
        index: i,
        negative: false,
        version: layout.compact_version,
    })
}

/// Encodes a new positive element; `blob` is 0 when key and value are inline.
pub fn encode(key: &[u8], value: &[u8], blob_off: u64, version: u64, txn: bool) -> [u64; 4] {
    let meta = Meta {
        negative: false,
        key_inline: (key.len() <= 8).then_some(key.len() as u8),
        value_inline: (value.len() <= 8).then_some(value.len() as u8),
        txn,
        version,
    };
    let value_word = if value.len() <= 8 { inline_value_word(value) } else { 0 };
    [nv::key_word(key), blob_off, value_word, meta.encode()]
}

/// The NEGATIVE twin of a stored element (same key, same blob), written at
/// `version`.
pub fn negate(words: [u64; 4], version: u64, txn: bool) -> [u64; 4] {
    let meta = (words[3] & !(nv::VERSION_MASK | nv::TXN))
        | nv::NEGATIVE
        | (version & nv::VERSION_MASK)
        | if txn { nv::TXN } else { 0 };
    [words[0], words[1], words[2], meta]
}

pub fn inline_value_word(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..v.len()].copy_from_slice(v);
    u64::from_le_bytes(b)
}

/// Writes the blob for `key`/`value` at `off` and flushes it (the element's
/// fence covers it).
pub fn write_blob<S: Space>(s: &S, off: u64, key: &[u8], value: &[u8]) {
    let k: &[u8] = if key.len() > 8 { key } else { &[] };
    let v: &[u8] = if value.len() > 8 { value } else { &[] };
    let mut buf = Vec::with_capacity(blob::size(k.len(), v.len()) as usize);
    buf.extend_from_slice(&blob::header_word(k.len(), v.len()).to_le_bytes());
    buf.extend_from_slice(k);
    buf.extend_from_slice(v);
    s.write(off, &buf);
    s.flush(off, buf.len() as u64, points::BLOB_FLUSH);
}

/// Whether `key` and `value` need a blob, and of what size.
pub fn blob_size(key: &[u8], value: &[u8]) -> Option<u64> {
    let k = if key.len() > 8 { key.len() } else { 0 };
    let v = if value.len() > 8 { value.len() } else { 0 };
    (k + v > 0).then(|| blob::size(k, v))
}

/// Full key of an element given its words.
pub fn element_key<S: Space>(s: &S, words: &[u64; 4]) -> Vec<u8> {
    let meta = Meta::decode(words[3]).expect("valid meta");
    match meta.key_inline {
        Some(l) => nv::word_key(words[0], l as usize),
        None => {
            let (kl, _) = blob::lens(s.read_u64(words[1]));
            let mut k = vec![0u8; kl as usize];
            s.read(words[1] + blob::DATA_OFF, &mut k);
            k
        }
    }
}

/// Value of an element given its words.
pub fn element_value<S: Space>(s: &S, words: &[u64; 4]) -> Vec<u8> {
    let meta = Meta::decode(words[3]).expect("valid meta");
    match meta.value_inline {
        Some(l) => words[2].to_le_bytes()[..l as usize].to_vec(),
        None => {
            let (kl, vl) = blob::lens(s.read_u64(words[1]));
            let mut v = vec![0u8; vl as usize];
            s.read(words[1] + blob::DATA_OFF + kl, &mut v);
            v
        }
    }
}

impl LeafFormat for Nv {
    const NAME: &'static str = "nv";

    #[inline]
    fn capacity(size: u64) -> u64 {
        nv::capacity(size)
    }
    #[inline]
    fn count<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::COUNT_OFF)
    }
    #[inline]
    fn next<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::NEXT_OFF)
    }
    #[inline]
    fn size<S: Space>(s: &S, leaf: u64) -> u64 {
        s.load(leaf + nv::SIZE_OFF)
    }
    #[inline]
    fn next_word(leaf: u64) -> u64 {
        leaf + nv::NEXT_OFF
    }

    fn layout_ok<S: Space>(s: &S, leaf: u64, size: u64, count: u64) -> bool {
        Layout::read(s, leaf).valid(size, count)
    }

    fn newest<S: Space>(s: &S, leaf: &LeafRef, n: u64, key: &[u8], at: u64) -> Option<Newest> {
        let h = hints(s, leaf);
        let kw = nv::key_word(key);
        let fk = fingerprint(kw);
        let layout = h.layout(leaf.off);
        // Newest first: the newest element for a key decides (a NEGATIVE one
        // cancels the positive it follows, NV-Tree §4.3). Full elements
        // are newer than the compact prefix. Only elements whose
        // fingerprint matches (or is unknown) are read from the leaf.
        if let Some(t) = &h.table {
            if let Some(found) = newest_by_table(s, t, &layout, n, key, kw, at) {
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

    fn append<S: Space>(s: &S, leaf: &LeafRef, n: u64, elems: &[[u64; 4]]) {
        let h = hints(s, leaf);
        for (j, e) in elems.iter().enumerate() {
            h.note(n + j as u64, e[0]);
        }
        let at = h.layout(leaf.off).elem(n);
        let leaf = leaf.off;
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
            for (k, word) in w.iter().enumerate() {
                let o = j * 32 + k * 8;
                buf[o..o + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        s.write(at, buf);
        s.flush(at, len as u64, points::NV_ELEMENT_FLUSH);
        s.fence(points::NV_ELEMENT_FENCE);
        s.publish(
            leaf + nv::COUNT_OFF,
            n + elems.len() as u64,
            points::NV_COUNT_FLUSH,
            points::NV_COUNT_FENCE,
        );
    }

    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]) {
        assert!(elems.len() as u64 <= nv::capacity(size));
        // Settled elements with 8-byte keys and values go to the compact
        // prefix. `elems` is in key order with a key's versions adjacent
        // and a settled element first among them, so the prefix comes out
        // in strictly increasing key order, one entry per key, each before
        // the key's full elements (version order kept).
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
        let mut compact: Vec<&Slot> = Vec::with_capacity(keep as usize);
        let mut full: Vec<&Slot> = Vec::with_capacity(elems.len() - keep as usize);
        for (e, &fit) in elems.iter().zip(&fits) {
            if fit && (compact.len() as u64) < keep {
                compact.push(e);
            } else {
                full.push(e);
            }
        }
        let version = compact.iter().map(|e| e.version()).max().unwrap_or(0);
        let start = nv::full_start(compact.len() as u64);
        let used = start + full.len() as u64 * nv::ELEM_SIZE;
        let mut buf = vec![0u8; used as usize];
        let mut put = |o: u64, w: u64| buf[o as usize..][..8].copy_from_slice(&w.to_le_bytes());
        put(nv::COUNT_OFF, elems.len() as u64);
        put(nv::NEXT_OFF, next);
        put(nv::SIZE_OFF, size);
        put(nv::COMPACT_OFF, compact.len() as u64);
        put(nv::COMPACT_VERSION_OFF, version);
        for (j, e) in compact.iter().enumerate() {
            let o = nv::ELEMS_OFF + j as u64 * nv::COMPACT_SIZE;
            put(o + nv::C_KEY_WORD, e.words[0]);
            put(o + nv::C_VALUE_WORD, e.words[2]);
        }
        for (j, e) in full.iter().enumerate() {
            for (k, word) in e.words.iter().enumerate() {
                put(start + j as u64 * nv::ELEM_SIZE + k as u64 * 8, *word);
            }
        }
        s.write(leaf, &buf);
        s.flush(leaf, used.max(LINE), points::NV_NEWLEAF_FLUSH);
    }

    const VERSIONED: bool = true;

    /// A search tests the DRAM fingerprints, one byte per 32-byte element
    /// (one line of them per 32 leaf lines), and reads only the elements
    /// whose fingerprint matches: about one.
    const SEARCH_LINE_SHARE: f64 = 1.0 / 32.0;

    fn read<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], at: u64) -> Option<Option<Vec<u8>>> {
        let n = leaf.durable.load(Ordering::Acquire);
        Some(match Self::lookup_at(s, leaf, n, key, at) {
            Lookup::Present(i) => Some(element_value(s, &cached_layout(s, leaf).words(s, i))),
            Lookup::Absent => None,
        })
    }

    fn upsert<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], value: &[u8], blob: u64, clock: &Clock) -> Written {
        let n = leaf.durable.load(Ordering::Relaxed);
        let layout = cached_layout(s, leaf);
        // The lines the append will write (the next element's and the
        // count's) are fetched while the lookup runs.
        if n < Self::capacity(leaf.size) {
            s.prefetch_write(layout.elem(n));
        }
        s.prefetch_write(leaf.off + nv::COUNT_OFF);
        // The old element's words, for its NEGATIVE twin.
        let old = match Self::lookup(s, leaf, n, key) {
            Lookup::Present(i) => Some(layout.words(s, i)),
            Lookup::Absent => None,
        };
        let need = if old.is_some() { 2 } else { 1 };
        if n + need > Self::capacity(leaf.size) {
            return Written::Full;
        }
        let w = clock.begin_write();
        let new = encode(key, value, blob, w.ts, false);
        match &old {
            Some(o) => Self::append(s, leaf, n, &[negate(*o, w.ts, false), new]),
            None => Self::append(s, leaf, n, &[new]),
        }
        leaf.durable.store(n + need, Ordering::Release);
        drop(w);
        // An old blob stays referenced by the old element until a rewrite drops it.
        Written::Done {
            inserted: old.is_none(),
            freed: None,
        }
    }

    fn remove<S: Space>(s: &S, leaf: &LeafRef, key: &[u8], clock: &Clock) -> Removed {
        let n = leaf.durable.load(Ordering::Relaxed);
        // A NEGATIVE element is appended only when a positive one exists (§4.3).
        let Lookup::Present(i) = Self::lookup(s, leaf, n, key) else {
            return Removed::Done {
                existed: false,
                freed: None,
            };
        };
        if n + 1 > Self::capacity(leaf.size) {
            return Removed::Full;
        }
        let old = cached_layout(s, leaf).words(s, i);
        let w = clock.begin_write();
        Self::append(s, leaf, n, &[negate(old, w.ts, false)]);
        leaf.durable.store(n + 1, Ordering::Release);
        drop(w);
        Removed::Done {
            existed: true,
            freed: None,
        }
    }

    fn collate_leaf<S: Space>(s: &S, leaf: &LeafRef, keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated {
        collate_in(s, leaf.off, leaf.durable.load(Ordering::Acquire), keep, lo, hi)
    }

    fn has_room<S: Space>(_s: &S, leaf: &LeafRef, need: u64) -> bool {
        leaf.durable.load(Ordering::Relaxed) + need <= Self::capacity(leaf.size)
    }

    fn scan<S: Space>(s: &S, off: u64, committed: u64) -> std::result::Result<Scan, String> {
        let pool = crate::format::header::pool_size(s);
        let size = Self::size(s, off);
        if size < nv::MIN_SIZE || size % LINE != 0 || size > pool - off {
            return Err(format!("leaf {off} has invalid size {size}"));
        }
        let count = Self::count(s, off);
        if count > Self::capacity(size) {
            return Err(format!(
                "leaf {off} count {count} exceeds capacity {}",
                Self::capacity(size)
            ));
        }
        let layout = Layout::read(s, off);
        if !Self::layout_ok(s, off, size, count) {
            return Err(format!(
                "leaf {off} has an invalid compact prefix ({} of {count})",
                layout.compact
            ));
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
                crate::recovery::validate_blob(s, b, meta, pool).map_err(|w| format!("leaf {off} element {i}: {w}"))?;
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

    fn validate<S: Space>(s: &S, off: u64, data_start: u64) -> std::result::Result<(u64, Option<u64>), Damage> {
        crate::format::validate::nv_leaf(s, off, data_start).map(|(size, count)| (size, Some(count)))
    }

    fn audit<S: Space>(s: &S, leaf: &LeafRef, ctx: &AuditCtx<'_>) -> Audit {
        let off = leaf.off;
        let mut a = Audit::default();
        let persistent = Self::count(s, off);
        if persistent > Self::capacity(leaf.size) {
            a.problems.push(format!(
                "leaf {off}: count {persistent} exceeds capacity {}",
                Self::capacity(leaf.size)
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
        let undone = !s.writable()
            && n < persistent
            && (n..persistent).all(|i| {
                let m = Meta::decode(layout.words(s, i)[3]);
                m.is_some_and(|m| m.txn && m.version > ctx.committed)
            });
        if n != persistent && !undone {
            a.problems.push(format!(
                "leaf {off}: durable count {n} differs from persistent count {persistent}"
            ));
        }
        let mut newest: HashMap<Vec<u8>, bool> = HashMap::new();
        let mut versions: HashMap<Vec<u8>, u64> = HashMap::new();
        for i in 0..n.min(persistent) {
            let words = layout.words(s, i);
            if Meta::decode(words[3]).is_none() {
                a.problems
                    .push(format!("leaf {off} element {i}: invalid metadata {:#x}", words[3]));
                continue;
            }
            if let Err(w) = crate::recovery::leaf_blob_ok(s, &words, ctx.pool) {
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
            if neg && newest.get(&el.key) != Some(&true) {
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

/// A key for messages.
pub fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn hints_with(fps: &[u8]) -> Hints {
        let fp: Box<[AtomicU64]> = (0..fps.len().div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        for (i, &f) in fps.iter().enumerate() {
            let w = &fp[i / 8];
            w.store(
                w.load(Ordering::Relaxed) | (f as u64) << ((i % 8) * 8),
                Ordering::Relaxed,
            );
        }
        Hints {
            compact: 0,
            compact_version: 0,
            fp,
            table: None,
        }
    }

    /// Elements of a leaf, in append order (key and words), and the blobs
    /// they name (offset, key, value).
    type Blobs = Vec<(u64, Vec<u8>, Vec<u8>)>;
    type Elements = Vec<(Vec<u8>, [u64; 4])>;
    fn history(seed: u64, steps: usize) -> (Elements, Blobs) {
        history_of(&shared_word_keys(), seed, steps, 1)
    }

    /// Keys that share key words: inline keys that are prefixes of each
    /// other, and long keys with the same first 8 bytes.
    fn shared_word_keys() -> Vec<Vec<u8>> {
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
    fn history_of(keys: &[Vec<u8>], seed: u64, steps: usize, first_ts: u64) -> (Elements, Blobs) {
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
    fn unsettled(elems: &Elements) -> Vec<Slot> {
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
        for seed in 1..40u64 {
            let (elems, blobs) = history(seed, 200);
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
            let leaf = LeafRef::with(off, size, kept.len() as u64);
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
                        let by_table = newest_by_table(&s, t, &layout, r, q, nv::key_word(q), at);
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

    #[test]
    fn key_table_notes_out_of_order_stop_its_use() {
        let t = KeyTable::new(200).unwrap();
        assert!(KeyTable::new(KeyTable::MIN_CAPACITY).is_none());
        for i in 0..10 {
            t.note(i, i % 3);
        }
        assert!(t.covers(10) && !t.covers(11));
        assert_eq!(t.find(1), Some(7));
        assert_eq!(t.find(3), None);
        t.note(12, 5);
        assert!(!t.covers(10));
    }

    #[test]
    fn zero_bytes_marks_exactly_the_zero_bytes() {
        for v in [
            0u64,
            u64::MAX,
            0x0100_ff00_8000_0001,
            0x8080_8080_8080_8080,
            0x0001_0000_0100_7f00,
        ] {
            let want: u64 = (0..8)
                .filter(|k| (v >> (k * 8)) & 0xff == 0)
                .map(|k| 0x80u64 << (k * 8))
                .sum();
            assert_eq!(zero_bytes(v), want, "{v:#x}");
        }
    }

    #[test]
    fn candidates_are_the_matching_or_unknown_slots_highest_first() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let fps: Vec<u8> = (0..203)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Few distinct values, some unknown (0), so every case occurs.
                (x % 5) as u8 * 60
            })
            .collect();
        let h = hints_with(&fps);
        for fk in [60u8, 120, 180, 240, 7] {
            for (lo, hi) in [
                (0, 203),
                (3, 9),
                (8, 16),
                (5, 6),
                (17, 17),
                (0, 1),
                (190, 203),
                (41, 200),
            ] {
                let want: Vec<u64> = (lo..hi)
                    .rev()
                    .filter(|&i| fps[i as usize] == fk || fps[i as usize] == 0)
                    .collect();
                let mut got = Vec::new();
                h.candidates(lo, hi, fk, |i| {
                    got.push(i);
                    false
                });
                assert_eq!(got, want, "fk {fk} in {lo}..{hi}");
            }
        }
        // Stopping early stops.
        let mut seen = 0;
        h.candidates(0, 203, 60, |_| {
            seen += 1;
            seen == 3
        });
        assert_eq!(seen, 3);
    }

    #[test]
    fn fingerprints_are_never_unknown() {
        for kw in [0u64, 1, u64::MAX, 0x8000_0000_0000_0000, 0x0123_4567_89ab_cdef] {
            assert_ne!(fingerprint(kw), 0);
        }
        let h = hints_with(&[0; 16]);
        h.note(9, 42);
        h.note(10, 43);
        let mut got = Vec::new();
        h.candidates(0, 16, fingerprint(42), |i| {
            got.push(i);
            false
        });
        // Slot 10 holds another key's fingerprint unless they collide.
        assert!(got.contains(&9) && (!got.contains(&10) || fingerprint(42) == fingerprint(43)));
    }
}
