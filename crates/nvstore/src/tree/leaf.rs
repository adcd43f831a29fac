//! The leaf-format trait (docs/design.md, "Write paths") and the `nv` format (NV-Tree §4.3–4.4).
//!
//! The tree, recovery, `check` and the crash tests are generic over
//! [`LeafFormat`]; a format decides how elements sit in a leaf, how an append
//! is made durable and published, and how a new leaf is built for a split.

use std::ops::Bound as RB;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::collate::{Collated, Keep, Slot};
use super::mvcc::Clock;
use super::Leaf;
use crate::format::leaf_nv::{self as nv, Meta};
use crate::format::validate::Damage;
use crate::pmem::{Point, Space};

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

/// Where a value a reader found lives: inline in its element's value word,
/// or in the element's blob (published bytes, immutable until epoch
/// reclamation frees them, so a reader that keeps its epoch pinned can lend
/// them out without copying).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueRef {
    /// The first `len` bytes of `word`, little-endian.
    Inline { word: u64, len: u8 },
    /// `len` bytes at pool offset `off`.
    Blob { off: u64, len: u64 },
}

impl ValueRef {
    /// The value of the element with `words` (its metadata already valid).
    #[inline]
    pub fn of<S: Space>(s: &S, words: &[u64; 4]) -> ValueRef {
        let meta = Meta::decode(words[3]).expect("valid meta");
        match meta.value_inline {
            Some(len) => ValueRef::Inline { word: words[2], len },
            None => {
                let (kl, vl) = crate::format::blob::lens(s.read_u64(words[1]));
                ValueRef::Blob {
                    off: crate::format::blob::value_at(words[1], kl),
                    len: vl,
                }
            }
        }
    }

    /// Runs `f` on the value's bytes: from the stack for an inline value,
    /// straight from the pool (where the space can lend it) for a blob.
    #[inline]
    pub fn with<S: Space, R>(self, s: &S, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            ValueRef::Inline { word, len } => f(&word.to_le_bytes()[..len as usize]),
            ValueRef::Blob { off, len } => s.with_bytes(off, len, f),
        }
    }
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

    /// What the format keeps of each leaf in DRAM only, inside the leaf's
    /// handle ([`super::LeafRef::state`]); generic code never reads it.
    type State: Default + Send + Sync + 'static;

    /// Runs `f`, which reads the leaf's published words, with the format's
    /// reader protocol: a format that changes published words in place runs
    /// it again until no writer changed the leaf meanwhile.
    #[inline]
    fn read_settled<T>(_leaf: &Leaf<Self>, mut f: impl FnMut() -> T) -> T {
        f()
    }

    /// Elements a leaf of `size` bytes holds (the split and merge
    /// thresholds are fractions of it).
    fn capacity(size: u64) -> u64;
    /// The most elements a leaf of `size` bytes may hold in any layout: a
    /// bound on counts read from media. [`LeafFormat::capacity`] unless
    /// the format packs some elements tighter.
    fn max_count(size: u64) -> u64 {
        Self::capacity(size)
    }
    /// Elements this leaf holds before it is full: its layout may hold more
    /// than [`LeafFormat::capacity`] (nv: a compact prefix).
    fn room<S: Space>(_s: &S, leaf: &Leaf<Self>) -> u64 {
        Self::capacity(leaf.size)
    }
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
    fn newest<S: Space>(s: &S, leaf: &Leaf<Self>, n: u64, key: &[u8], at: u64) -> Option<Newest>;

    /// What a reader at `at` finds for `key` among the first `n` elements.
    #[inline]
    fn lookup_at<S: Space>(s: &S, leaf: &Leaf<Self>, n: u64, key: &[u8], at: u64) -> Lookup {
        match Self::newest(s, leaf, n, key, at) {
            Some(e) if !e.negative => Lookup::Present(e.index),
            _ => Lookup::Absent,
        }
    }

    /// The newest state of `key` among the first `n` elements.
    #[inline]
    fn lookup<S: Space>(s: &S, leaf: &Leaf<Self>, n: u64, key: &[u8]) -> Lookup {
        Self::lookup_at(s, leaf, n, key, u64::MAX)
    }
    /// Reads element `i` (key loaded from the blob if needed).
    fn element<S: Space>(s: &S, leaf: u64, i: u64) -> Elem;
    /// The value of element `i`.
    fn value<S: Space>(s: &S, leaf: u64, i: u64) -> Vec<u8>;

    /// Appends `elems` after the first `n`, durably, and stores the count
    /// (the format decides how it is persisted: see `format/leaf_nv.rs`).
    /// The caller holds the leaf lock and then raises `leaf.durable`,
    /// which is what publishes them to readers.
    fn append<S: Space>(s: &S, leaf: &Leaf<Self>, n: u64, elems: &[[u64; 4]]);

    /// Writes a complete new leaf (unlinked, flushed but not fenced: the
    /// caller fences once for all new leaves of a split).
    fn build<S: Space>(s: &S, leaf: u64, size: u64, next: u64, elems: &[Slot]);

    /// The DRAM handle of a leaf [`LeafFormat::build`] just wrote at `off`
    /// with `elems`: its format state may be filled from them.
    fn handle<S: Space>(_s: &S, off: u64, size: u64, elems: &[Slot]) -> Leaf<Self>
    where
        Self: Sized,
    {
        Leaf::<Self>::built(off, size, elems.len() as u64)
    }

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
    fn split_in_place<S: Space>(_s: &S, _leaf: &Leaf<Self>, _new_off: u64, _right: &[Slot]) {
        unreachable!("{} leaves split by copying", Self::NAME)
    }

    /// Finds `key` as of `at` with the format's reader protocol (no lock):
    /// where its value lives, or `Some(None)` when it has none; `None` when
    /// the key has moved to another leaf (route again). The caller keeps
    /// the epoch pinned while it reads the value through the answer.
    fn read_ref<S: Space>(s: &S, leaf: &Leaf<Self>, key: &[u8], at: u64) -> Option<Option<ValueRef>>;

    /// A word from which a reader that has routed to this leaf, but not yet
    /// read its DRAM handle, can guess the line holding a key
    /// ([`LeafFormat::prefetch_guess`]); kept next to the leaf's handle in
    /// its PLN. 0 means not known yet; a format without a guess answers 1.
    fn guide<S: Space>(_s: &S, _leaf: &Leaf<Self>) -> u64 {
        1
    }

    /// Starts loading the line(s) of the leaf that most likely hold the
    /// 8-byte key whose word is `kw`, given the leaf's `guide` and the
    /// prefix words `lo` (exclusive) and `hi` (inclusive) of its bounds,
    /// so that miss overlaps the one on the leaf's DRAM handle. Only a
    /// hint: it changes nothing, and a wrong guess costs a line's load.
    #[inline]
    fn prefetch_guess<S: Space>(_s: &S, _guide: u64, _lo: u64, _hi: u64, _kw: u64) {}

    /// Starts fetching, for writing, the line a write or delete of the
    /// leaf whose guide is `guide` stores to whatever its key (the nv
    /// leaf's header line, with its deletion bits), so that miss too
    /// overlaps the one on the handle. A hint, as `prefetch_guess`.
    #[inline]
    fn prefetch_head<S: Space>(_s: &S, _guide: u64) {}

    /// [`LeafFormat::read_ref`] with the value copied out.
    fn read<S: Space>(s: &S, leaf: &Leaf<Self>, key: &[u8], at: u64) -> Option<Option<Vec<u8>>> {
        Self::read_ref(s, leaf, key, at).map(|v| v.map(|v| v.with(s, <[u8]>::to_vec)))
    }

    /// Inserts or updates `key` (the caller holds the leaf lock and checked
    /// it is not dead); durable and visible when it returns `Done`.
    /// With `existing`, writes only over a key the leaf holds, and answers
    /// [`Written::Absent`] (having written nothing) when it holds none.
    fn upsert<S: Space>(
        s: &S,
        leaf: &Leaf<Self>,
        key: &[u8],
        value: &[u8],
        blob: u64,
        existing: bool,
        clock: &Clock,
    ) -> Written;

    /// Elements a write takes in a leaf, for the adaptive profile: an
    /// insert or an update appends one (NV-Tree Table 3 counts two for an
    /// update, whose NEGATIVE twin nvstore does not write).
    fn appended(_inserted: bool) -> u64 {
        1
    }

    /// Removes `key` (leaf lock held, as for [`LeafFormat::upsert`]).
    fn remove<S: Space>(s: &S, leaf: &Leaf<Self>, key: &[u8], clock: &Clock) -> Removed;

    /// The leaf's elements in `[lo, hi]` collated as `keep` says, read with
    /// the format's reader protocol (or under the leaf lock).
    fn collate_leaf<S: Space>(s: &S, leaf: &Leaf<Self>, keep: Keep, lo: &RB<Vec<u8>>, hi: &RB<Vec<u8>>) -> Collated;

    /// Whether a new leaf of `size` bytes holds `elems` with room for
    /// `extra` more.
    fn fits(size: u64, elems: &[Slot], extra: u64) -> bool {
        Self::capacity(size) >= elems.len() as u64 + extra
    }

    /// Whether a leaf has room for `need` more elements (a split that lost
    /// a race finds room made by another).
    fn has_room<S: Space>(s: &S, leaf: &Leaf<Self>, need: u64) -> bool;

    /// Recovery: validates the leaf at `off` and gathers what the rebuild
    /// needs (`committed`: the header's commit record).
    fn scan<S: Space>(s: &S, off: u64, committed: u64) -> std::result::Result<Scan, String>;
    /// Recovery: lowers the leaf's published count to `count` and flushes
    /// it (the caller fences), undoing what [`Scan::undo`] found.
    fn lower_count<S: Space>(s: &S, leaf: u64, count: u64);

    /// Recovery of a writable pool, after every leaf was scanned: makes the
    /// leaf at `off` agree with its recovered `count`. When `undo` (the scan
    /// cut an uncommitted transaction's elements) the change must be durable
    /// before any new commit record: it is flushed here and the caller
    /// fences once for all leaves. Returns whether it flushed anything.
    fn recovered<S: Space>(_s: &S, _off: u64, _count: u64, _undo: bool) -> bool {
        false
    }

    /// Clean shutdown: persists what the leaf's format keeps in DRAM speed
    /// only (flushed here; the clean word's fence orders it).
    fn settle<S: Space>(_s: &S, _leaf: &Leaf<Self>) {}

    /// `check`: every invariant of one leaf the format owns.
    fn audit<S: Space>(s: &S, leaf: &Leaf<Self>, ctx: &AuditCtx<'_>) -> Audit;

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
    /// An update of a key the leaf does not hold: nothing written.
    Absent,
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

/// A key for messages.
pub fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

/// Reader side of a leaf's in-place change sequence (a DRAM word, odd while
/// a writer changes published words in place): runs `f` again until no
/// writer changed the leaf meanwhile, so a reader never returns a word a
/// crash could still lose.
#[inline]
pub(super) fn read_stable<T>(seq: &AtomicU64, mut f: impl FnMut() -> T) -> T {
    loop {
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let r = f();
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s1 {
            return r;
        }
    }
}

/// Writer side of [`read_stable`]: the sequence word is odd while `f` runs.
///
/// The caller holds the leaf's lock, so it is the word's only writer, and
/// both changes are a load and a store, not a locked read-modify-write: on
/// x86 a locked instruction right after `f`'s fence waits until the line
/// just flushed has been written back (see `tree/sync.rs`). The release
/// fence orders the odd store before `f`'s stores, as the seqlock writer
/// of Boehm's "Can seqlocks get along with programming language memory
/// models?" does; the even store releases them.
#[inline]
pub(super) fn write_visible<T>(seq: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let s0 = seq.load(Ordering::Relaxed);
    debug_assert!(s0 & 1 == 0, "two writers of one leaf's sequence word");
    seq.store(s0 + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    let r = f();
    seq.store(s0 + 2, Ordering::Release);
    r
}

/// Replaces the published word at `at` in place: stored, flushed and fenced
/// while the sequence word is odd (one failure-atomic 8-byte store).
#[inline]
pub(super) fn store_in_place<S: Space>(s: &S, seq: &AtomicU64, at: u64, word: u64, flush: Point, fence: Point) {
    write_visible(seq, || {
        s.store(at, word);
        s.flush(at, 8, flush);
        s.fence(fence);
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::{read_stable, write_visible};

    /// A writer changes two words together under [`write_visible`]; readers
    /// under [`read_stable`] must never return them apart, nor see the
    /// sequence word odd once the writer is done.
    #[test]
    fn readers_never_see_a_change_half_made() {
        let seq = AtomicU64::new(0);
        let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
        let done = AtomicBool::new(false);
        const WRITES: u64 = 20_000;
        std::thread::scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    let mut seen = 0;
                    while !done.load(Ordering::Acquire) {
                        let (x, y) = read_stable(&seq, || (a.load(Ordering::Relaxed), b.load(Ordering::Relaxed)));
                        assert_eq!(x, y, "a reader saw a change half made");
                        assert!(x >= seen, "a reader went back in time: {x} after {seen}");
                        seen = x;
                    }
                });
            }
            sc.spawn(|| {
                for i in 1..=WRITES {
                    write_visible(&seq, || {
                        a.store(i, Ordering::Relaxed);
                        std::hint::spin_loop();
                        b.store(i, Ordering::Relaxed);
                    });
                }
                done.store(true, Ordering::Release);
            });
        });
        assert_eq!(seq.load(Ordering::Relaxed), 2 * WRITES);
        assert_eq!((a.into_inner(), b.into_inner()), (WRITES, WRITES));
    }
}
