//! DRAM lookup hints of an nv leaf: one fingerprint byte per element and,
//! for large leaves, a key table (never persisted).

use std::sync::atomic::{AtomicU64, Ordering};

use super::LeafRef;
use crate::format::leaf_nv::{self as nv, Layout};
use crate::pmem::Space;

/// DRAM hints of an nv leaf: its layout words and one fingerprint byte per
/// element slot, so a lookup reads from the leaf only the elements whose
/// fingerprint matches its key (an unsorted leaf is otherwise scanned
/// whole, and the lines its appends flushed are usually out of the cache).
/// Never persisted: built from the leaf on first use (published elements
/// never change), and extended by appends before they publish, so a
/// reader that sees an element sees its fingerprint. A slot whose
/// fingerprint is unknown (0: appended by a writer that ran while a reader
/// was building the hints) is read like any other. Laid out in field
/// order: what every lookup reads first.
#[repr(C)]
pub struct Hints {
    pub(super) compact: u64,
    pub(super) compact_version: u64,
    /// The leaf's `gone` words (elements deleted in place): read
    /// from the leaf when the hints are built, then changed by the deleter
    /// with the leaf's, while its sequence word is odd.
    pub(super) gone: [AtomicU64; 2],
    /// Eight fingerprints per word (element `i` in byte `i % 8` of word
    /// `i / 8`), so a lookup tests eight elements at once.
    pub(super) fp: FpWords,
    /// Leaves of more than [`KeyTable::MIN_CAPACITY`] elements (enlarged
    /// ones, mostly) also map each key word to its newest element, so a
    /// lookup there reads one table slot and one element instead of
    /// scanning fingerprints back to the key's last write.
    pub(super) table: Option<KeyTable>,
}

/// The DRAM state of an nv leaf (`LeafFormat::State`): its hints, built
/// on first use.
pub type HintsCell = std::sync::OnceLock<Hints>;

/// What an nv leaf keeps in DRAM: its lookup hints, and a sequence word
/// that is odd while a compact entry's value is replaced in place (a
/// reader that saw it change reads again: it never returns a value that is
/// not yet durable).
#[derive(Default)]
pub struct NvState {
    pub(super) hints: HintsCell,
    pub(super) seq: std::sync::atomic::AtomicU64,
    /// The newest timestamp of a value replaced in place in this leaf
    /// (reported as the version of its compact entries, see `Nv::newest`).
    pub(super) in_place: std::sync::atomic::AtomicU64,
}

/// The fingerprint words of a leaf: inside the hints (so inside the leaf's
/// DRAM handle, no pointer to follow and miss on) for leaves of up to
/// `8 * INLINE_WORDS` elements, the common node sizes; on the heap beyond.
pub(super) enum FpWords {
    Inline([AtomicU64; INLINE_WORDS]),
    Heap(Box<[AtomicU64]>),
}

/// Fingerprint words kept inline: 32 elements, a 1 KB nv leaf's capacity.
const INLINE_WORDS: usize = 8;

impl FpWords {
    /// `words` zeroed (unknown) fingerprint words.
    pub(super) fn zeroed(words: usize) -> FpWords {
        if words <= INLINE_WORDS {
            FpWords::Inline(Default::default())
        } else {
            FpWords::Heap((0..words).map(|_| AtomicU64::new(0)).collect())
        }
    }
}

impl std::ops::Deref for FpWords {
    type Target = [AtomicU64];
    #[inline]
    fn deref(&self) -> &[AtomicU64] {
        match self {
            FpWords::Inline(w) => w,
            FpWords::Heap(w) => w,
        }
    }
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
pub(super) struct KeyTable {
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

    pub(super) fn new(capacity: u64) -> Option<KeyTable> {
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
    pub(super) fn find(&self, kw: u64) -> Option<u64> {
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
    pub(super) fn note(&self, i: u64, kw: u64) {
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
    pub(super) fn covers(&self, n: u64) -> bool {
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
    /// Hints of a leaf laid out as `layout` (its `gone` words `gone`) with
    /// room for `cap` elements, none of them noted yet.
    pub(super) fn empty(layout: &Layout, gone: [u64; 2], cap: u64) -> Hints {
        Hints {
            compact: layout.compact,
            compact_version: layout.compact_version,
            gone: gone.map(AtomicU64::new),
            fp: FpWords::zeroed(cap.div_ceil(8) as usize),
            table: KeyTable::new(cap),
        }
    }

    /// Everything the hints hold, as plain values (tests compare hints
    /// built two ways).
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    pub(super) fn snapshot(&self) -> (u64, u64, [u64; 2], Vec<u64>, Option<(Vec<u32>, u64, bool)>) {
        let load = |w: &AtomicU64| w.load(Ordering::Relaxed);
        (
            self.compact,
            self.compact_version,
            [load(&self.gone[0]), load(&self.gone[1])],
            self.fp.iter().map(load).collect(),
            self.table.as_ref().map(|t| {
                (
                    t.slots.iter().map(|x| x.load(Ordering::Relaxed)).collect(),
                    load(&t.noted),
                    t.gap.load(Ordering::Relaxed),
                )
            }),
        )
    }

    pub(super) fn layout(&self, leaf: u64) -> Layout {
        Layout {
            leaf,
            compact: self.compact,
            compact_version: self.compact_version,
            gone: [
                self.gone[0].load(Ordering::Relaxed),
                self.gone[1].load(Ordering::Relaxed),
            ],
        }
    }

    /// The elements in `lo..hi` that may hold a key with fingerprint `fk`
    /// (it matches or is unknown), highest first, until `f` says stop.
    #[inline]
    pub(super) fn candidates(&self, lo: u64, hi: u64, fk: u8, mut f: impl FnMut(u64) -> bool) {
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

    /// Element `i`'s key is unknown (undecodable): its slot matches every
    /// lookup and the key table, which would miss it, is no longer used.
    pub(super) fn note_unknown(&self, i: u64) {
        let word = &self.fp[(i / 8) as usize];
        let shift = (i % 8) * 8;
        word.store(word.load(Ordering::Relaxed) & !(0xff << shift), Ordering::Relaxed);
        if let Some(t) = &self.table {
            t.gap.store(true, Ordering::Relaxed);
        }
    }

    /// Element `i` has lookup word `kw` ([`lookup_word`] of its key): the
    /// caller is the one writer of the leaf (or builds the hints), before
    /// the count publishes element `i`.
    #[inline]
    pub(super) fn note(&self, i: u64, kw: u64) {
        let word = &self.fp[(i / 8) as usize];
        let shift = (i % 8) * 8;
        let w = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(w | (fingerprint(kw) as u64) << shift, Ordering::Relaxed);
        if let Some(t) = &self.table {
            t.note(i, kw);
        }
    }
}

/// The word a lookup hashes into its fingerprint and key-table slot: the
/// key word for keys of up to eight bytes (compact entries and inline
/// keys), a hash of the whole key for longer ones. Longer keys often share
/// their first eight bytes with every key of their leaf (a common prefix:
/// `user:1..`, a server's namespaced keys), so fingerprints of key words
/// alone would match them all and a lookup would read every element.
pub(super) fn lookup_word(key: &[u8]) -> u64 {
    if key.len() <= 8 {
        nv::key_word(key)
    } else {
        let mut h = KeyHash::new();
        h.update(key);
        h.finish()
    }
}

/// FNV-1a over a key's bytes, fed in pieces (a blob key is read in chunks).
struct KeyHash(u64);

impl KeyHash {
    fn new() -> Self {
        KeyHash(0xcbf2_9ce4_8422_2325)
    }
    #[inline]
    fn update(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// [`lookup_word`] of the element with words `w` (its key read from its
/// blob when longer than eight bytes); `None` for undecodable meta.
pub(super) fn element_lookup_word<S: Space>(s: &S, w: &[u64; 4]) -> Option<u64> {
    let meta = nv::Meta::decode(w[3])?;
    if meta.key_inline.is_some() {
        return Some(w[0]);
    }
    let (kl, _) = crate::format::blob::lens(s.read_u64(w[1]));
    if kl <= 8 {
        return Some(w[0]);
    }
    let mut h = KeyHash::new();
    let mut buf = [0u8; 64];
    let mut done = 0;
    while done < kl {
        let n = (kl - done).min(buf.len() as u64) as usize;
        s.read(crate::format::blob::key_at(w[1]) + done, &mut buf[..n]);
        h.update(&buf[..n]);
        done += n as u64;
    }
    Some(h.finish())
}

/// A key word's fingerprint: 1..=255 (0 means unknown).
#[inline]
pub(super) fn fingerprint(kw: u64) -> u8 {
    ((kw.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) % 255 + 1) as u8
}

/// The leaf's hints, built on first use.
pub(super) fn hints<'a, S: Space>(s: &S, leaf: &'a LeafRef<NvState>) -> &'a Hints {
    leaf.state.hints.get_or_init(|| {
        let layout = Layout::read(s, leaf.off);
        // Sized by the handle's size, which recovery or the leaf's
        // validation checked (a read-only view of a pool without leaves
        // has size 0), never by a word read from media again.
        let size_cap = if leaf.size >= nv::MIN_SIZE {
            nv::capacity_at(leaf.size, layout.compact)
        } else {
            0
        };
        let cap = size_cap.max(leaf.durable.load(Ordering::Relaxed));
        let h = Hints::empty(&layout, layout.gone_below(leaf.durable.load(Ordering::Relaxed)), cap);
        // Elements published now; any appended later note their own (or,
        // if their writer missed these hints, stay unknown).
        let n = leaf.durable.load(Ordering::Acquire);
        for i in 0..n {
            let lw = if i < layout.compact {
                Some(layout.key_word(s, i))
            } else {
                element_lookup_word(s, &layout.words(s, i))
            };
            match lw {
                Some(lw) => h.note(i, lw),
                None => h.note_unknown(i),
            }
        }
        h
    })
}

/// The leaf's layout from its hints: reading elements through it reads no
/// header line (which the last append flushed out of the cache).
pub(super) fn cached_layout<S: Space>(s: &S, leaf: &LeafRef<NvState>) -> Layout {
    hints(s, leaf).layout(leaf.off)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hints_with(fps: &[u8]) -> Hints {
        let fp = FpWords::zeroed(fps.len().div_ceil(8));
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
            gone: Default::default(),
            fp,
            table: None,
        }
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
    fn long_keys_sharing_a_key_word_get_their_own_lookup_words() {
        let a = lookup_word(b"m\0\0\0\x08_indices:user1");
        let b = lookup_word(b"m\0\0\0\x08_indices:user2");
        assert_ne!(a, b);
        assert_eq!(lookup_word(b"abc"), nv::key_word(b"abc"));
        assert_eq!(lookup_word(b"abcdefgh"), nv::key_word(b"abcdefgh"));
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

    #[test]
    fn hints_are_sized_by_the_checked_size() {
        use crate::pmem::SimSpace;
        let s = SimSpace::new(64 * 1024);
        // A damaged size word in the leaf: the handle's checked size decides.
        let off = 4096;
        s.store(nv::NvLeaf::at(off).size_word(), 1 << 60);
        let leaf = LeafRef::<NvState>::with(off, 1024, 3);
        let fp = &hints(&s, &leaf).fp;
        assert!(matches!(fp, FpWords::Inline(_)) && fp.len() as u64 * 8 >= nv::capacity(1024));
        // The read-only view of a pool without leaves: size 0, no hints.
        s.store(nv::NvLeaf::at(0).size_word(), u64::MAX);
        let empty = LeafRef::<NvState>::with(0, 0, 0);
        let fp = &hints(&s, &empty).fp;
        assert!(matches!(fp, FpWords::Inline(_)) && fp.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }
}
