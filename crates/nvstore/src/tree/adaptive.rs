//! Workload-adaptive node sizing (NV-Tree §5).
//!
//! - Profiling (Tables 2 and 3): global `nWrites` / `nReads` and per-leaf
//!   counters, all in DRAM. A write counts the elements it appends (an
//!   update appends two), a search counts one read. A split gives each half
//!   half of the counters, a replace keeps them, a merge adds them. Nothing
//!   is counted while the strategy is `Off`.
//! - Each leaf also counts its *scans*: the lookups writes make before they
//!   append (an update finds the old element, an insert checks the key is
//!   new). They cost what a search costs, so the model counts them with the
//!   reads; Algorithm 3's read/write classification does not.
//! - [`algorithm3`]: the direction and step of the size change for the new
//!   leaves made from a full one, per strategy.
//! - [`Model`]: Eq. 1–4 bound every enlargement and shrink with the read
//!   and write times `T_r(size)`, `T_w(size)` of the medium, measured by
//!   [`calibrate`] when a pool is opened and cached in the pool header
//!   (its calibration words, [`crate::format::header`]).
//! - Hot-write PLNs get a larger limit at rebuild (§5.5), in
//!   [`super::index::Index::build_adaptive`] via [`hot_pln_extra`].

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Instant;

use parking_lot::RwLock;

use crate::alloc::Allocator;
use crate::format::leaf_nv::{ELEM_SIZE, MIN_SIZE};
use crate::pmem::{points, Space, LINE};

/// The size step of the conservative moves: one cache line.
pub const STEP: u64 = LINE;
/// Largest leaf adaptivity makes: the largest slab class (bigger blocks
/// take whole chunk runs, and a bigger leaf makes every rewrite of it long).
pub const MAX_LEAF: u64 = crate::alloc::MAX_CLASS;

/// Which sizing strategy of NV-Tree §5.3 runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Every new leaf gets the pool's node size (no profiling).
    Off,
    /// Only write-intensive hot-write cold-read leaves grow, and only
    /// read-intensive cold-write hot-read ones shrink, one line at a time.
    Conservative,
    /// Every write-intensive leaf doubles; nothing shrinks.
    Aggressive,
    /// Write-intensive leaves double when hot-write, else grow a line;
    /// read-intensive hot-read leaves shrink a line.
    Balanced,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Off,
        Strategy::Conservative,
        Strategy::Aggressive,
        Strategy::Balanced,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Off => "off",
            Strategy::Conservative => "conservative",
            Strategy::Aggressive => "aggressive",
            Strategy::Balanced => "balanced",
        }
    }

    fn from_u8(v: u8) -> Strategy {
        match v {
            1 => Strategy::Conservative,
            2 => Strategy::Aggressive,
            3 => Strategy::Balanced,
            _ => Strategy::Off,
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Strategy::ALL.into_iter().find(|x| x.as_str() == s).ok_or_else(|| {
            format!("unknown adaptive strategy '{s}' (expected off, conservative, aggressive or balanced)")
        })
    }
}

/// One leaf's profile (`nWrites_LN[i]`, `nReads_LN[i]`, and the scans of
/// its writes), in a cache line of its own: readers counting a search must
/// not disturb the line the leaf's writers use.
#[derive(Default)]
#[repr(align(64))]
pub struct LeafCounters {
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub scans: AtomicU64,
}

/// A snapshot of [`LeafCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeafProfile {
    pub writes: u64,
    pub reads: u64,
    pub scans: u64,
}

impl LeafProfile {
    /// Both leaves' counts (a merge).
    pub fn plus(self, o: LeafProfile) -> LeafProfile {
        LeafProfile {
            writes: self.writes + o.writes,
            reads: self.reads + o.reads,
            scans: self.scans + o.scans,
        }
    }
    /// One of `parts` equal shares (a split).
    pub fn share(self, parts: u64) -> LeafProfile {
        let parts = parts.max(1);
        LeafProfile {
            writes: self.writes / parts,
            reads: self.reads / parts,
            scans: self.scans / parts,
        }
    }
}

impl LeafCounters {
    pub fn new(p: LeafProfile) -> LeafCounters {
        LeafCounters {
            writes: AtomicU64::new(p.writes),
            reads: AtomicU64::new(p.reads),
            scans: AtomicU64::new(p.scans),
        }
    }
    pub fn get(&self) -> LeafProfile {
        LeafProfile {
            writes: self.writes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            scans: self.scans.load(Ordering::Relaxed),
        }
    }
    pub fn set(&self, p: LeafProfile) {
        self.writes.store(p.writes, Ordering::Relaxed);
        self.reads.store(p.reads, Ordering::Relaxed);
        self.scans.store(p.scans, Ordering::Relaxed);
    }
}

/// The counters Algorithm 3 looks at for one decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// The leaf's elements appended and searches.
    pub leaf_writes: u64,
    pub leaf_reads: u64,
    /// The leaf's lookups by writes (see the module notes).
    pub leaf_scans: u64,
    /// Global elements appended and searches, and the number of leaves.
    pub writes: u64,
    pub reads: u64,
    pub leaves: u64,
}

impl Counts {
    /// `nReads_LN / nWrites_LN < 1`.
    fn write_intensive(&self) -> bool {
        self.leaf_reads < self.leaf_writes
    }
    /// `nWrites_LN > nWrites / N_LN` (without the division).
    fn hot_write(&self) -> bool {
        self.leaf_writes as u128 * self.leaves.max(1) as u128 > self.writes as u128
    }
    /// Cold is "not hot": at or below the average. (Strictly below would
    /// make every leaf of a workload without searches neither hot-read nor
    /// cold-read, and the conservative strategy would never grow one, where
    /// NV-Tree Fig. 13 shows it growing leaves under update-only load.)
    fn cold_write(&self) -> bool {
        !self.hot_write()
    }
    fn hot_read(&self) -> bool {
        self.leaf_reads as u128 * self.leaves.max(1) as u128 > self.reads as u128
    }
    fn cold_read(&self) -> bool {
        !self.hot_read()
    }
    /// `R_r/w` as Eq. 2 and 3 use it: searches of the leaf per element
    /// appended, the scans of writes included, since each costs `T_r`
    /// (infinite for a leaf never written).
    fn search_ratio(&self) -> f64 {
        (self.leaf_reads + self.leaf_scans) as f64 / self.leaf_writes as f64
    }
}

/// Algorithm 3's answer before the model bounds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// One cache line smaller.
    Shrink,
    /// One cache line larger.
    Grow,
    Double,
}

/// Algorithm 3 (GETNEWSIZE), lines 2–31, as a direction and a step.
pub fn algorithm3(s: Strategy, c: &Counts) -> Step {
    use Strategy::*;
    let mut up_or_down = 0i8;
    if c.write_intensive() {
        if (s == Conservative && c.hot_write() && c.cold_read()) || s == Aggressive || s == Balanced {
            up_or_down = 1;
        }
    } else if (s == Conservative && c.cold_write() && c.hot_read()) || (s == Balanced && c.hot_read()) {
        up_or_down = -1;
    }
    match up_or_down {
        0 => Step::Keep,
        -1 => Step::Shrink,
        _ if (s == Balanced && c.hot_write()) || s == Aggressive => Step::Double,
        _ => Step::Grow,
    }
}

/// `T_r(size)` and `T_w(size)` as fixed cost plus a cost per cache line,
/// in nanoseconds, and the DRAM side of a split.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Model {
    pub read_fixed_ns: f64,
    pub read_line_ns: f64,
    pub write_fixed_ns: f64,
    pub write_line_ns: f64,
    /// What a split costs besides reading the old node and writing the new
    /// ones: allocation, collation, the new PLN, retiring the old node.
    /// NV-Tree's Eq. 1 and 4 count only the node reads and flushes; here
    /// the DRAM work is of the same order or larger, and leaving it out
    /// makes the model refuse enlargements that pay. Measured as the tree
    /// runs ([`Profile::record_split`]); 0 until the first split.
    pub split_fixed_ns: f64,
    /// The share of a leaf's lines one in-node search reads (set by the
    /// leaf format, not measured): 1 for a format that scans every element,
    /// less for one that tests DRAM fingerprints first and reads only the
    /// elements that match (see [`crate::tree::leaf::LeafFormat::SEARCH_LINE_SHARE`]).
    pub search_line_share: f64,
}

impl Default for Model {
    /// DRAM-like costs for when no calibration has run (simulated spaces).
    fn default() -> Model {
        Model {
            read_fixed_ns: 20.0,
            read_line_ns: 2.0,
            write_fixed_ns: 100.0,
            write_line_ns: 20.0,
            split_fixed_ns: 0.0,
            search_line_share: 1.0,
        }
    }
}

impl Model {
    /// Time to read (scan) a node of `size` bytes.
    pub fn t_r(&self, size: u64) -> f64 {
        self.read_fixed_ns + self.read_line_ns * size.div_ceil(LINE) as f64
    }
    /// What one in-node search pays for `size` bytes more node to search
    /// (Eq. 2 and 3 use `T_r` for it): the lines of them the search reads.
    /// The fixed cost of `T_r` is left out: every search pays it whatever
    /// the node's size, so it is no extra cost of a larger node.
    pub fn t_scan(&self, size: u64) -> f64 {
        self.read_line_ns * size.div_ceil(LINE) as f64 * self.search_line_share
    }
    /// Time to write, flush and fence a node of `size` bytes.
    pub fn t_w(&self, size: u64) -> f64 {
        self.write_fixed_ns + self.write_line_ns * size.div_ceil(LINE) as f64
    }

    /// The cost of splitting a full node of `size` bytes into two (Eq. 1's
    /// positive side, Eq. 4's negative side).
    pub fn split_cost(&self, size: u64) -> f64 {
        self.t_r(size) + 2.0 * self.t_w(size / 2) + self.split_fixed_ns
    }

    /// Eq. 1 > Eq. 2: growing from `old` to `new` saves more split cost than
    /// it adds in-node scanning.
    pub fn enlarge_pays(&self, old: u64, new: u64, c: &Counts) -> bool {
        let positive = self.split_cost(old);
        let negative = ((new - old) / ELEM_SIZE) as f64 * c.search_ratio() * self.t_scan(old) * 2.0;
        positive > negative
    }

    /// Eq. 3 > Eq. 4: shrinking from `old` to `new` saves more scanning
    /// than the earlier split costs.
    pub fn shrink_pays(&self, old: u64, new: u64, c: &Counts) -> bool {
        let positive = ((old - new) / ELEM_SIZE) as f64 * c.search_ratio() * self.t_scan(new) * 2.0;
        let negative = self.split_cost(new);
        positive > negative
    }

    /// GETNEWSIZE with the model's bound: the size for the new leaves made
    /// from a full leaf of `size` bytes. A doubling the model refuses falls
    /// back to one line under the balanced strategy and to no change under
    /// the aggressive one (NV-Tree §6.4.2); refused steps keep the size.
    pub fn new_size(&self, s: Strategy, size: u64, c: &Counts) -> u64 {
        let grow = |to: u64| (to <= MAX_LEAF && self.enlarge_pays(size, to, c)).then_some(to);
        let new = match algorithm3(s, c) {
            Step::Keep => None,
            Step::Shrink => size
                .checked_sub(STEP)
                .filter(|&to| to >= MIN_SIZE && self.shrink_pays(size, to, c)),
            Step::Grow => grow(size + STEP),
            Step::Double => grow(2 * size).or_else(|| {
                if s == Strategy::Balanced {
                    grow(size + STEP)
                } else {
                    None
                }
            }),
        };
        new.unwrap_or(size)
    }

    /// Packs the model into the two header words: per-line costs in
    /// sixteenths of a nanosecond, fixed costs in nanoseconds, 16 bits each;
    /// the second word also holds the emulated latency the model was
    /// measured at and a check of the first.
    pub fn encode(&self, latency_ns: u64) -> [u64; 2] {
        let f = |v: f64, scale: f64| (v * scale).round().clamp(1.0, u16::MAX as f64) as u64;
        let a = f(self.read_fixed_ns, 1.0)
            | f(self.read_line_ns, 16.0) << 16
            | f(self.write_fixed_ns, 1.0) << 32
            | f(self.write_line_ns, 16.0) << 48;
        let lat = latency_ns.min(u32::MAX as u64 - 1) + 1; // never 0: 0 means "none"
        [a, lat | (check16(a) << 32) | (CACHE_TAG << 48)]
    }

    /// The model cached for `latency_ns`, if the words hold one.
    pub fn decode(words: [u64; 2], latency_ns: u64) -> Option<Model> {
        let [a, b] = words;
        let lat = latency_ns.min(u32::MAX as u64 - 1) + 1;
        if b >> 48 != CACHE_TAG || (b >> 32) & 0xffff != check16(a) || b & 0xffff_ffff != lat {
            return None;
        }
        let g = |shift: u32, scale: f64| ((a >> shift) & 0xffff) as f64 / scale;
        Some(Model {
            read_fixed_ns: g(0, 1.0),
            read_line_ns: g(16, 16.0),
            write_fixed_ns: g(32, 1.0),
            write_line_ns: g(48, 16.0),
            split_fixed_ns: 0.0,
            search_line_share: 1.0,
        })
    }
}

/// Marks the calibration words as such.
const CACHE_TAG: u64 = 0xCA1B;

fn check16(a: u64) -> u64 {
    (crc32fast::hash(&a.to_le_bytes()) & 0xffff) as u64
}

/// Sizes the calibration measures, in bytes.
const CAL_SIZES: [u64; 2] = [512, 8192];
/// Repetitions per size; the fastest counts (the least disturbed).
const CAL_REPS: usize = 16;

/// Measures `T_r` and `T_w` on the space: writes, flushes and fences a
/// scratch block (allocated and freed again; nothing links to it, so a
/// crash meanwhile loses nothing) and scans it like a leaf search, at two
/// sizes, and fits fixed + per-line costs. Emulated latency is part of
/// every flush, so it is measured too. Takes about a millisecond without
/// emulated latency.
pub fn calibrate<S: Space>(space: &S, alloc: &Allocator) -> crate::error::Result<Model> {
    let big = CAL_SIZES[1];
    let off = alloc.alloc(space, big)?;
    let buf = vec![0x5au8; big as usize];
    let mut rbuf = vec![0u8; big as usize];
    let mut read = [0f64; 2];
    let mut write = [0f64; 2];
    for (i, &size) in CAL_SIZES.iter().enumerate() {
        let (mut best_r, mut best_w) = (f64::MAX, f64::MAX);
        for _ in 0..CAL_REPS {
            let t = Instant::now();
            space.write(off, &buf[..size as usize]);
            space.flush(off, size, points::CALIBRATE_FLUSH);
            space.fence(points::CALIBRATE_FENCE);
            best_w = best_w.min(t.elapsed().as_nanos() as f64);
            let t = Instant::now();
            // A search reads every element's key word.
            let mut acc = 0u64;
            for e in (0..size).step_by(ELEM_SIZE as usize) {
                acc = acc.wrapping_add(space.read_u64(off + e));
            }
            space.read(off, &mut rbuf[..size as usize]);
            std::hint::black_box(acc);
            best_r = best_r.min(t.elapsed().as_nanos() as f64);
        }
        read[i] = best_r;
        write[i] = best_w;
    }
    alloc.free(off);
    Ok(fit(read, write))
}

/// Fixed + per-line costs through the two measured points.
fn fit(read: [f64; 2], write: [f64; 2]) -> Model {
    let lines = [CAL_SIZES[0] / LINE, CAL_SIZES[1] / LINE].map(|l| l as f64);
    let per_line = |t: [f64; 2]| ((t[1] - t[0]) / (lines[1] - lines[0])).max(1.0 / 16.0);
    let fixed = |t: [f64; 2], pl: f64| (t[0] - pl * lines[0]).max(1.0);
    let (rl, wl) = (per_line(read), per_line(write));
    Model {
        read_fixed_ns: fixed(read, rl),
        read_line_ns: rl,
        write_fixed_ns: fixed(write, wl),
        write_line_ns: wl,
        split_fixed_ns: 0.0,
        search_line_share: 1.0,
    }
}

/// A global counter spread over cache lines, one per group of threads, so
/// threads counting at once do not contend for one line.
#[derive(Default)]
pub struct Striped([Padded; STRIPES]);

const STRIPES: usize = 8;

#[derive(Default)]
#[repr(align(64))]
struct Padded(AtomicU64);

impl Striped {
    #[inline]
    pub fn add(&self, v: u64) {
        use std::sync::atomic::AtomicUsize;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local!(static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        let i = SLOT.with(|s| *s);
        self.0[i].0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn load(&self) -> u64 {
        self.0.iter().map(|p| p.0.load(Ordering::Relaxed)).sum()
    }
}

/// A tree's profile and strategy (all DRAM).
pub struct Profile {
    strategy: AtomicU8,
    /// `nWrites`, `nReads`.
    pub writes: Striped,
    pub reads: Striped,
    /// `N_LN`: leaves in the tree.
    pub leaves: AtomicU64,
    model: RwLock<Model>,
    /// Running mean of splits' DRAM-side cost in ns, as f64 bits
    /// ([`Model::split_fixed_ns`]).
    split_fixed: AtomicU64,
    /// The leaf format's [`Model::search_line_share`].
    search_line_share: f64,
    /// Leaves made larger / smaller than the leaf they replaced, and PLNs
    /// given a larger limit at rebuild.
    pub enlarged: AtomicU64,
    pub shrunk: AtomicU64,
    pub hot_plns: AtomicU64,
}

impl Profile {
    pub fn new(leaves: u64, search_line_share: f64) -> Profile {
        Profile {
            strategy: AtomicU8::new(0),
            writes: Striped::default(),
            reads: Striped::default(),
            leaves: AtomicU64::new(leaves),
            model: RwLock::new(Model::default()),
            split_fixed: AtomicU64::new(0f64.to_bits()),
            search_line_share,
            enlarged: AtomicU64::new(0),
            shrunk: AtomicU64::new(0),
            hot_plns: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn strategy(&self) -> Strategy {
        Strategy::from_u8(self.strategy.load(Ordering::Relaxed))
    }

    #[inline]
    pub fn on(&self) -> bool {
        self.strategy.load(Ordering::Relaxed) != 0
    }

    pub fn set_strategy(&self, s: Strategy) {
        self.strategy.store(s as u8, Ordering::Relaxed);
    }

    /// The calibrated model with the measured split cost.
    pub fn model(&self) -> Model {
        Model {
            split_fixed_ns: f64::from_bits(self.split_fixed.load(Ordering::Relaxed)),
            search_line_share: self.search_line_share,
            ..*self.model.read()
        }
    }

    /// A split (or replace or merge) of a node of `old` bytes into nodes
    /// of `new` bytes took `elapsed_ns`: what the medium model does not
    /// explain goes into a running mean (weight 1/16). One sample counts
    /// at most 4 times the mean (a writer descheduled mid-split must not
    /// make every leaf grow). Callers hold the structure lock.
    pub fn record_split(&self, old: u64, new: &[u64], elapsed_ns: f64) {
        let m = *self.model.read();
        let medium = m.t_r(old) + new.iter().map(|&n| m.t_w(n)).sum::<f64>();
        let sample = (elapsed_ns - medium).max(0.0);
        let cur = f64::from_bits(self.split_fixed.load(Ordering::Relaxed));
        let next = if cur == 0.0 {
            sample
        } else {
            cur + (sample.min(4.0 * cur) - cur) / 16.0
        };
        self.split_fixed.store(next.to_bits(), Ordering::Relaxed);
    }

    pub fn set_model(&self, m: Model) {
        *self.model.write() = m;
    }

    /// Table 3: writes appending `elems` elements to `leaf` after
    /// `lookups` lookups of their keys there.
    #[inline]
    pub fn wrote(&self, leaf: &LeafCounters, elems: u64, lookups: u64) {
        if self.on() {
            leaf.writes.fetch_add(elems, Ordering::Relaxed);
            leaf.scans.fetch_add(lookups, Ordering::Relaxed);
            self.writes.add(elems);
        }
    }

    /// Table 3: a search in `leaf`.
    #[inline]
    pub fn read(&self, leaf: &LeafCounters) {
        if self.on() {
            leaf.reads.fetch_add(1, Ordering::Relaxed);
            self.reads.add(1);
        }
    }

    /// The counts for a decision about `leaf`.
    pub fn counts(&self, leaf: LeafProfile) -> Counts {
        Counts {
            leaf_writes: leaf.writes,
            leaf_reads: leaf.reads,
            leaf_scans: leaf.scans,
            writes: self.writes.load(),
            reads: self.reads.load(),
            leaves: self.leaves.load(Ordering::Relaxed),
        }
    }
}

/// §5.5: extra entries a PLN gets at rebuild when its leaves' writes
/// (`pln_writes`) exceed the average over `plns` PLNs of `total` writes:
/// one PLN-capacity unit (the default IN size) per doubling above average.
pub fn hot_pln_extra(pln_writes: u64, total: u64, plns: usize, unit: usize) -> usize {
    let plns = plns.max(1) as u128;
    if total == 0 || pln_writes as u128 * plns <= total as u128 {
        return 0;
    }
    let ratio = pln_writes as f64 * plns as f64 / total as f64;
    let doublings = ratio.log2().floor() as usize + 1;
    doublings.min(HOT_PLN_MAX_UNITS) * unit
}

/// At most this many units are added to one PLN at a rebuild (a split
/// copies its PLN, so the copy must stay short).
pub const HOT_PLN_MAX_UNITS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use Strategy::*;

    /// 100 leaves, 10 000 writes and 10 000 reads: the average leaf has 100 of each.
    fn counts(leaf_writes: u64, leaf_reads: u64) -> Counts {
        Counts {
            leaf_writes,
            leaf_reads,
            leaf_scans: 0,
            writes: 10_000,
            reads: 10_000,
            leaves: 100,
        }
    }

    #[test]
    fn algorithm3_write_intensive_branches() {
        // Hot-write, cold-read, write-intensive: every strategy grows.
        let c = counts(500, 50);
        assert_eq!(algorithm3(Conservative, &c), Step::Grow);
        assert_eq!(algorithm3(Aggressive, &c), Step::Double);
        assert_eq!(algorithm3(Balanced, &c), Step::Double);
        assert_eq!(algorithm3(Off, &c), Step::Keep);
        // Hot-write but also hot-read: conservative keeps.
        let c = counts(500, 200);
        assert_eq!(algorithm3(Conservative, &c), Step::Keep);
        assert_eq!(algorithm3(Aggressive, &c), Step::Double);
        assert_eq!(algorithm3(Balanced, &c), Step::Double);
        // No searches at all: every leaf is cold-read, so conservative grows.
        let c = Counts {
            reads: 0,
            ..counts(500, 0)
        };
        assert_eq!(algorithm3(Conservative, &c), Step::Grow);
        // Exactly average writes is cold-write, not hot.
        let c = counts(100, 10);
        assert_eq!(algorithm3(Balanced, &c), Step::Grow);
        assert_eq!(algorithm3(Conservative, &c), Step::Keep);
        // Cold-write write-intensive: balanced grows one line, conservative keeps.
        let c = counts(50, 10);
        assert_eq!(algorithm3(Conservative, &c), Step::Keep);
        assert_eq!(algorithm3(Aggressive, &c), Step::Double);
        assert_eq!(algorithm3(Balanced, &c), Step::Grow);
    }

    #[test]
    fn algorithm3_read_intensive_branches() {
        // Cold-write, hot-read, read-intensive: conservative and balanced shrink.
        let c = counts(50, 500);
        assert_eq!(algorithm3(Conservative, &c), Step::Shrink);
        assert_eq!(algorithm3(Balanced, &c), Step::Shrink);
        assert_eq!(algorithm3(Aggressive, &c), Step::Keep);
        // Hot-write and hot-read, read-intensive: only balanced shrinks.
        let c = counts(200, 500);
        assert_eq!(algorithm3(Conservative, &c), Step::Keep);
        assert_eq!(algorithm3(Balanced, &c), Step::Shrink);
        assert_eq!(algorithm3(Aggressive, &c), Step::Keep);
        // Cold-read read-intensive: nobody changes it.
        let c = counts(10, 50);
        for s in Strategy::ALL {
            assert_eq!(algorithm3(s, &c), Step::Keep, "{s}");
        }
        // Never touched (0 / 0 is not < 1): read side, cold: keep.
        let c = counts(0, 0);
        for s in Strategy::ALL {
            assert_eq!(algorithm3(s, &c), Step::Keep, "{s}");
        }
        // Equal reads and writes are not write-intensive.
        assert_eq!(algorithm3(Aggressive, &counts(300, 300)), Step::Keep);
    }

    /// Crafted costs: reads 1 ns per line, writes 10 ns per line, no fixed part.
    fn crafted() -> Model {
        Model {
            read_fixed_ns: 0.0,
            read_line_ns: 1.0,
            write_fixed_ns: 0.0,
            write_line_ns: 10.0,
            split_fixed_ns: 0.0,
            search_line_share: 1.0,
        }
    }

    #[test]
    fn enlarge_bound_follows_eq1_eq2() {
        let m = crafted();
        // 1 KiB: T_r = 16, 2 T_w(512) = 160, positive 176.
        // Doubling adds 32 elements: negative = 32 * R * 16 * 2 = 1024 R.
        // It pays while R < 176 / 1024 = 0.171875.
        assert!(m.enlarge_pays(1024, 2048, &counts(1000, 171)));
        assert!(!m.enlarge_pays(1024, 2048, &counts(1000, 172)));
        // One line (2 elements): negative = 64 R; pays while R < 2.75.
        assert!(m.enlarge_pays(1024, 1088, &counts(1000, 0)));
        // No reads: always pays.
        assert!(m.enlarge_pays(1024, 2048, &counts(1, 0)));
    }

    #[test]
    fn extra_search_cost_is_the_lines_a_search_reads() {
        // The fixed read cost prices the split (Eq. 1) but not the larger
        // node's extra search (Eq. 2): positive 116 + 160 = 276, negative
        // 32 * R * 16 * 2 = 1024 R, pays while R < 0.2695.
        let fixed = Model {
            read_fixed_ns: 100.0,
            ..crafted()
        };
        assert!(fixed.enlarge_pays(1024, 2048, &counts(1000, 269)));
        assert!(!fixed.enlarge_pays(1024, 2048, &counts(1000, 270)));
        // A search that reads 1/32 of the lines (nv fingerprints): the
        // negative is 32 * R * 0.5 * 2 = 32 R, pays while R < 5.5.
        let hinted = Model {
            search_line_share: 1.0 / 32.0,
            ..crafted()
        };
        assert_eq!(hinted.t_scan(1024), 0.5);
        assert!(hinted.enlarge_pays(1024, 2048, &counts(1000, 5499)));
        assert!(!hinted.enlarge_pays(1024, 2048, &counts(1000, 5501)));
        // Shrinking saves as little: Eq. 3 is 2 * R * 15/32 * 2 against 175.
        assert!(!hinted.shrink_pays(1024, 960, &counts(100, 9300)));
        assert!(hinted.shrink_pays(1024, 960, &counts(100, 9400)));
    }

    #[test]
    fn writes_scans_count_as_searches_in_the_model_only() {
        let m = crafted();
        // Update-only: 1000 elements from 500 updates, each a lookup.
        let c = Counts {
            leaf_scans: 500,
            ..counts(1000, 0)
        };
        // Still write-intensive and hot-write for Algorithm 3 ...
        assert_eq!(algorithm3(Balanced, &c), Step::Double);
        // ... but the model sees R = 0.5: doubling 1 KiB costs
        // 32 * 0.5 * 16 * 2 = 512 > 176, one line 32 < 176.
        assert!(!m.enlarge_pays(1024, 2048, &c));
        assert!(m.enlarge_pays(1024, 1088, &c));
        assert_eq!(m.new_size(Balanced, 1024, &c), 1088);
    }

    #[test]
    fn measured_split_cost_enters_eq1_and_eq4() {
        let c = Counts {
            leaf_scans: 500,
            ..counts(1000, 0)
        };
        // The DRAM side of a split makes the doubling pay: 176 + 400 > 512.
        let m = Model {
            split_fixed_ns: 400.0,
            search_line_share: 1.0,
            ..crafted()
        };
        assert_eq!(m.split_cost(1024), 576.0);
        assert!(m.enlarge_pays(1024, 2048, &c));
        assert_eq!(m.new_size(Balanced, 1024, &c), 2048);
        // ... and makes a shrink, which brings splits sooner, cost more:
        // R = 3 pays without it (2 * 3 * 15 * 2 = 180 > 175), not with it.
        let r3 = counts(100, 300);
        assert!(crafted().shrink_pays(1024, 960, &r3));
        assert!(!m.shrink_pays(1024, 960, &r3));
    }

    #[test]
    fn split_cost_is_a_damped_running_mean() {
        let p = Profile::new(1, 1.0);
        p.set_model(crafted());
        // 1 KiB into two 512s: medium part 16 + 2 * 80 = 176 ns.
        p.record_split(1024, &[512, 512], 1176.0);
        assert_eq!(p.model().split_fixed_ns, 1000.0);
        // A sample 100 times the mean counts as 4 times it.
        p.record_split(1024, &[512, 512], 100_176.0);
        assert_eq!(p.model().split_fixed_ns, 1000.0 + 3000.0 / 16.0);
        // Cheaper splits pull it down by a sixteenth of the difference.
        let cur = p.model().split_fixed_ns;
        p.record_split(1024, &[512, 512], 176.0);
        assert_eq!(p.model().split_fixed_ns, cur - cur / 16.0);
        // A split the medium model over-explains adds 0, not a negative cost.
        p.record_split(1024, &[512, 512], 0.0);
        assert!(p.model().split_fixed_ns > 0.0);
    }

    #[test]
    fn shrink_bound_follows_eq3_eq4() {
        let m = crafted();
        // 1 KiB -> 960: T_r(960) = 15, 2 T_w(480) = 2 * 80 = 160, negative 175.
        // Positive = 2 * R * 15 * 2 = 60 R: pays when R > 175 / 60 = 2.9166.
        assert!(!m.shrink_pays(1024, 960, &counts(100, 291)));
        assert!(m.shrink_pays(1024, 960, &counts(100, 292)));
        // A leaf never written: any reads make shrinking pay.
        assert!(m.shrink_pays(1024, 960, &counts(0, 1)));
    }

    #[test]
    fn new_size_applies_the_bounds() {
        let m = crafted();
        let hot_writes = counts(1000, 0);
        assert_eq!(m.new_size(Balanced, 1024, &hot_writes), 2048);
        assert_eq!(m.new_size(Aggressive, 1024, &hot_writes), 2048);
        assert_eq!(m.new_size(Conservative, 1024, &hot_writes), 1088);
        assert_eq!(m.new_size(Off, 1024, &hot_writes), 1024);
        // Never beyond the largest leaf: balanced falls back to a line,
        // aggressive keeps.
        assert_eq!(m.new_size(Balanced, MAX_LEAF, &hot_writes), MAX_LEAF);
        assert_eq!(m.new_size(Aggressive, MAX_LEAF, &hot_writes), MAX_LEAF);
        assert_eq!(m.new_size(Balanced, MAX_LEAF - 64, &hot_writes), MAX_LEAF);
        // R = 0.5 (hot-write, still write-intensive): doubling 1 KiB would
        // cost 512 > 176, one line costs 32 < 176.
        let mixed = counts(1000, 500);
        assert_eq!(m.new_size(Balanced, 1024, &mixed), 1088);
        assert_eq!(m.new_size(Aggressive, 1024, &mixed), 1024);
        // Read-heavy hot-read: shrink one line when Eq. 3 > Eq. 4.
        let reads = counts(10, 5000);
        assert_eq!(m.new_size(Balanced, 1024, &reads), 960);
        assert_eq!(m.new_size(Conservative, 1024, &reads), 960);
        assert_eq!(m.new_size(Aggressive, 1024, &reads), 1024);
        // ... but never below the smallest leaf.
        assert_eq!(m.new_size(Balanced, MIN_SIZE, &reads), MIN_SIZE);
        // Mildly read-intensive (R = 2): Eq. 3 < Eq. 4, keep.
        let mild = counts(110, 220);
        assert_eq!(algorithm3(Balanced, &mild), Step::Shrink);
        assert_eq!(m.new_size(Balanced, 1024, &mild), 1024);
    }

    #[test]
    fn calibration_words_round_trip() {
        let m = Model {
            read_fixed_ns: 35.0,
            read_line_ns: 2.5,
            write_fixed_ns: 120.0,
            write_line_ns: 300.0625,
            split_fixed_ns: 0.0,
            search_line_share: 1.0,
        };
        let w = m.encode(300);
        assert_eq!(Model::decode(w, 300), Some(m));
        // Another latency setting, a torn pair, or zeroes: not a cache.
        assert_eq!(Model::decode(w, 0), None);
        assert_eq!(Model::decode([w[0] ^ 4, w[1]], 300), None);
        assert_eq!(Model::decode([0, 0], 0), None);
    }

    #[test]
    fn calibration_measures_the_space() {
        let s = crate::pmem::SimSpace::new(1 << 20);
        let a = Allocator::fresh(65536, 65536, 1 << 20);
        let m = calibrate(&s, &a).unwrap();
        assert!(m.t_w(8192) > m.t_w(512) && m.t_r(8192) > m.t_r(512), "{m:?}");
        assert_eq!(a.used_bytes(), 0, "the scratch block is freed");
    }

    #[test]
    fn hot_plns_grow_by_doublings_above_average() {
        // 10 PLNs, 1000 writes: the average PLN has 100.
        assert_eq!(hot_pln_extra(100, 1000, 10, 32), 0);
        assert_eq!(hot_pln_extra(101, 1000, 10, 32), 32);
        assert_eq!(hot_pln_extra(200, 1000, 10, 32), 64);
        assert_eq!(hot_pln_extra(399, 1000, 10, 32), 64);
        assert_eq!(hot_pln_extra(1000, 1000, 10, 32), 4 * 32);
        assert_eq!(hot_pln_extra(1000, 1000, 1 << 20, 32), HOT_PLN_MAX_UNITS * 32);
        assert_eq!(hot_pln_extra(5, 0, 10, 32), 0);
    }

    #[test]
    fn strategy_names_parse() {
        for s in Strategy::ALL {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        }
        assert!("fast".parse::<Strategy>().is_err());
    }
}
